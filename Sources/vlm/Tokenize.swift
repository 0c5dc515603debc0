import ArgumentParser
import Foundation
import SwiftVLM

struct Tokenize: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Token ids of texts, with the special tokens the tokenizer adds by default, no padding.")

    @OptionGroup var options: ModelOption

    @Flag(help: "Print JSON instead of lines.")
    var json = false

    @Argument(help: "Texts to tokenize.")
    var texts: [String]

    private struct Result: Encodable {
        let text: String
        let ids: [Int]
        let tokens: [String]
    }

    func run() throws {
        let tokenizer = try Tokenizer(directory: URL(fileURLWithPath: options.model))
        let results = texts.map { text in
            let encoding = tokenizer.encode(text)
            return Result(text: text, ids: encoding.ids, tokens: encoding.tokens)
        }
        if json {
            try printJSON(results)
            return
        }
        for result in results {
            print(result.text)
            print("  ids:    \(result.ids.map(String.init).joined(separator: " "))")
            print("  tokens: \(result.tokens.joined(separator: " "))")
        }
    }
}
