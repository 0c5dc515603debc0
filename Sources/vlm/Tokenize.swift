import ArgumentParser
import Foundation
import SwiftVLM

struct Tokenize: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Token ids of texts (with the special tokens the tokenizer adds by default, no padding), decoding of ids, or a chat rendered with the model's template.")

    @OptionGroup var options: ModelOption

    @Flag(help: "Print JSON instead of lines.")
    var json = false

    @Flag(help: "Treat the arguments as token ids and print the decoded text.")
    var decode = false

    @Flag(help: "With --decode: leave out special tokens.")
    var skipSpecialTokens = false

    @Flag(help: "Encode without the special tokens the tokenizer adds (bos, eos, [CLS]...), as add_special_tokens=False.")
    var noSpecialTokens = false

    @Option(help: "A second sequence encoded with each text as a pair (text, pair).")
    var pair: String?

    @Option(help: "A JSON file holding a list of chat messages to render with the model's chat template.")
    var chat: String?

    @Flag(help: "With --chat: end with the assistant turn's opening, as add_generation_prompt=True does.")
    var addGenerationPrompt = false

    @Flag(help: "With --chat and --json: also the assistant mask, 1 for each token the template's {% generation %} blocks mark (return_assistant_tokens_mask=True), the tokens supervised fine-tuning trains on.")
    var assistantMask = false

    @Argument(help: "Texts to tokenize, or ids with --decode.")
    var inputs: [String] = []

    func validate() throws {
        guard !assistantMask || (chat != nil && json) else { throw ValidationError("--assistant-mask goes with --chat and --json") }
        if chat != nil {
            guard inputs.isEmpty, !decode, pair == nil, !noSpecialTokens else { throw ValidationError("--chat takes no other inputs") }
        } else if decode && pair != nil {
            throw ValidationError("--pair encodes; it does not go with --decode")
        } else if decode && noSpecialTokens {
            throw ValidationError("--no-special-tokens encodes; with --decode, --skip-special-tokens leaves them out")
        } else if inputs.isEmpty {
            throw ValidationError("give texts to tokenize, ids with --decode, or --chat MESSAGES.json")
        }
    }

    private struct Encoded: Encodable {
        let text: String
        let ids: [Int]
        let tokens: [String]
    }

    private struct Rendered: Encodable {
        let text: String
        let ids: [Int]
        var assistantMasks: [Int]?

        enum CodingKeys: String, CodingKey {
            case text, ids, assistantMasks = "assistant_masks"
        }
    }

    func run() async throws {
        let path = try await options.fileOrDirectory()
        let (tokenizer, template) = try loadTokenizer(path: path)
        if let chat {
            guard let template else { throw TokenizeError.noChatTemplate(path.path) }
            try renderChat(file: chat, template: template, tokenizer: tokenizer)
        } else if decode {
            let ids = try inputs.map { argument in
                guard let id = Int(argument), id >= 0 else { throw TokenizeError.notAnId(argument) }
                return id
            }
            let text = tokenizer.decode(ids, skipSpecialTokens: skipSpecialTokens)
            if json { try printJSON(["text": text]) } else { print(text) }
        } else {
            let results = inputs.map { text in
                let encoding = tokenizer.encode(text, pair: pair, addSpecialTokens: !noSpecialTokens)
                return Encoded(text: text, ids: encoding.ids, tokens: encoding.tokens)
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

    /// Renders like `apply_chat_template(messages, tokenize=False)`; the ids are that text encoded without adding
    /// special tokens, as `tokenize=True` does.
    private func renderChat(file: String, template: ChatTemplate, tokenizer: Tokenizer) throws {
        let rendered = try template.renderMarkingGenerations(
            messages: readMessages(file), addGenerationPrompt: addGenerationPrompt,
            bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token), eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
        let encoding = tokenizer.encode(rendered.text, addSpecialTokens: false)
        if json {
            try printJSON(Rendered(text: rendered.text, ids: encoding.ids,
                                   assistantMasks: assistantMask ? encoding.mask(covering: rendered.generations) : nil))
        } else {
            print(rendered.text, terminator: "")
        }
    }
}

enum TokenizeError: Error, CustomStringConvertible {
    case notAnId(String)
    case noChatTemplate(String)
    case unreadable(String)
    case notAMessageList(String)

    var description: String {
        switch self {
        case .notAnId(let argument): return "\"\(argument)\" is not a token id"
        case .noChatTemplate(let model): return "\(model): no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json's chat_template; a GGUF's tokenizer.chat_template)"
        case .unreadable(let file): return "\(file): cannot read the file"
        case .notAMessageList(let file): return "\(file): expected a JSON list of messages"
        }
    }
}
