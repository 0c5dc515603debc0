import Foundation
import Testing
@testable import VLMTokenizers

@Suite struct PatternTests {
    static let sources = [
        #"\s+"#,
        #"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"#,
        #"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"#,
    ]

    /// The hand-compiled alternations must find exactly what a regex engine finds, on every oracle string.
    @Test(arguments: sources) func handCompiledMatchesRegexEngine(source: String) throws {
        let compiled = try #require(AlternationPattern.known(source))
        let regex = try RegexPattern(source, file: "test")
        let texts = sharedStrings
        #expect(texts.count >= 5000)
        var disagreements: [String] = []
        for text in texts {
            let scalars = Array(text.unicodeScalars)
            if compiled.matches(in: scalars) != regex.matches(in: scalars) { disagreements.append(text.debugDescription) }
        }
        #expect(disagreements.isEmpty, "\(disagreements.prefix(5))")
    }

    @Test func splitBehaviors() {
        let text = Array("a--b-c".unicodeScalars)
        let dash = LiteralPattern(literal: ["-"])
        func run(_ behavior: SplitBehavior, invert: Bool = false) -> [String] {
            behavior.split(text, by: dash, invert: invert).map { String(String.UnicodeScalarView(text[$0])) }
        }
        #expect(run(.removed) == ["a", "b", "c"])
        #expect(run(.isolated) == ["a", "-", "-", "b", "-", "c"])
        #expect(run(.mergedWithPrevious) == ["a-", "-", "b-", "c"])
        #expect(run(.mergedWithNext) == ["a", "-", "-b", "-c"])
        #expect(run(.contiguous) == ["a", "--", "b", "-", "c"])
        #expect(run(.removed, invert: true) == ["-", "-", "-"])
    }
}

@Suite struct LoadingErrorTests {
    static let minimalModel = #""model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}"#

    private func loadError(_ files: [String: String]) throws -> TokenizerError? {
        let directory = try temporaryDirectory(files: files)
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            _ = try Tokenizer(directory: directory)
            return nil
        } catch let error as TokenizerError {
            return error
        }
    }

    /// Found by the tokenizer fuzz target: a WordPiece id past Int32 trapped while its prefix trie was built. Ids are
    /// tokenizers' u32: all 32 bits work, and a larger one is refused with one line naming it.
    @Test func vocabularyIdsAreU32() throws {
        func wordPiece(_ id: String) -> [String: String] {
            ["tokenizer.json": #"{"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "ab": \#(id)}}}"#]
        }
        let directory = try temporaryDirectory(files: wordPiece("4294967295"))
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try Tokenizer(directory: directory).encode("ab", addSpecialTokens: false).ids == [4_294_967_295])
        let error = try #require(try loadError(wordPiece("4294967296")))
        #expect("\(error)".contains("\"ab\" is not an integer from 0 to 4294967295"), "\(error)")
    }

    @Test func minimalTokenizerLoadsAndMerges() throws {
        let directory = try temporaryDirectory(files: ["tokenizer.json": "{\(Self.minimalModel)}"])
        defer { try? FileManager.default.removeItem(at: directory) }
        let tokenizer = try Tokenizer(directory: directory)
        #expect(tokenizer.encode("ab").ids == [2])
        #expect(tokenizer.encode("ba").ids == [1, 0])
    }

    @Test func unknownComponentTypeNamesFileAndType() throws {
        let error = try #require(try loadError(["tokenizer.json": #"{"pre_tokenizer": {"type": "Blocks"}, \#(Self.minimalModel)}"#]))
        guard case let .unsupportedComponent(file, path, type) = error else { Issue.record("\(error)"); return }
        #expect(file.hasSuffix("tokenizer.json"))
        #expect(path == "$.pre_tokenizer")
        #expect(type == "Blocks")
        #expect(error.description.contains("Blocks"))
    }

    @Test func malformedJSONNamesFile() throws {
        let error = try #require(try loadError(["tokenizer.json": #"{"model": {"type": "BPE", "vocab": "#]))
        guard case let .malformedJSON(file, _) = error else { Issue.record("\(error)"); return }
        #expect(file.hasSuffix("tokenizer.json"))
    }

    @Test func wrongFieldKindsAreErrors() throws {
        let missingVocab = try #require(try loadError(["tokenizer.json": #"{"model": {"type": "BPE", "merges": []}}"#]))
        #expect(missingVocab.description.contains("$.model.vocab"))
        let badMerge = try #require(try loadError(["tokenizer.json": #"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a z"]}}"#]))
        guard case .mergeOutOfVocabulary = badMerge else { Issue.record("\(badMerge)"); return }
        let badBehavior = try #require(try loadError(["tokenizer.json":
            #"{"pre_tokenizer": {"type": "Split", "pattern": {"String": "x"}, "behavior": "Sideways"}, \#(Self.minimalModel)}"#]))
        #expect(badBehavior.description.contains("Sideways"))
        let badRegex = try #require(try loadError(["tokenizer.json":
            #"{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}, \#(Self.minimalModel)}"#]))
        guard case .invalidRegex = badRegex else { Issue.record("\(badRegex)"); return }
        let notAnObject = try #require(try loadError(["tokenizer.json": "[1, 2]"]))
        guard case .malformedJSON = notAnObject else { Issue.record("\(notAnObject)"); return }
    }

    @Test func missingFilesAreErrors() throws {
        let empty = try #require(try loadError([:]))
        guard case .noTokenizerFiles = empty else { Issue.record("\(empty)"); return }
        let legacyWithoutMerges = try #require(try loadError([
            "tokenizer_config.json": #"{"tokenizer_class": "CLIPTokenizer"}"#, "vocab.json": #"{"a": 0}"#,
        ]))
        guard case let .unreadable(file, _) = legacyWithoutMerges else { Issue.record("\(legacyWithoutMerges)"); return }
        #expect(file.hasSuffix("merges.txt"))
    }
}
