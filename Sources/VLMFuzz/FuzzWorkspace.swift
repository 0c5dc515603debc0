import Foundation
import SwiftVLM
import VLMServer

/// A scratch directory for inputs that readers take as files, and the real files (tokenizers, a tiny checkpoint, a
/// chat template) that some targets run the input against, found under the repository's test fixtures.
final class FuzzWorkspace {
    let root: URL
    let fixtures: URL
    private var tokenizers: [Tokenizer]?
    private var template: ChatTemplate?
    private var server: VLMServer?

    /// `fixtures` is Tests/Fixtures of the repository.
    init(fixtures: URL) throws {
        self.fixtures = fixtures
        // /dev/shm keeps the per-input writes off the disk where it exists.
        let base = FileManager.default.fileExists(atPath: "/dev/shm") ? URL(fileURLWithPath: "/dev/shm") : FileManager.default.temporaryDirectory
        root = base.appendingPathComponent("vlm-fuzz-\(getpid())")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: root) }

    /// Loads what `target` runs its inputs against, so that the first input is timed like the others.
    func prepare(for target: FuzzTarget) throws {
        switch target {
        case .text: _ = try realTokenizers()
        case .chat: _ = try llavaTemplate()
        case .config: _ = try checkpoint(config: Array("{}".utf8))
        case .gguf, .tokenizer:
            // The first split regex naming a Unicode class builds that class's Oniguruma table from every code
            // point, once per process (0.6 s for all of them in a debug build, more under AddressSanitizer): done
            // here, so that it is not charged to whichever input happens to come first as a hang.
            let classes = [#"\p{Han}"#, #"\p{Ll}"#, #"\p{Lm}"#, #"\p{Lo}"#, #"\p{Lt}"#, #"\p{Lu}"#, #"\p{L}"#,
                           #"\p{M}"#, #"\p{N}"#, #"\p{P}"#, #"\p{S}"#]
            let pattern = classes.joined(separator: "|").replacingOccurrences(of: "\\", with: "\\\\")
            let json = #"{"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": ""# + pattern + #""}, "behavior": "Isolated", "invert": false}}"#
            try write(Array(json.utf8), to: "warm-up/tokenizer.json")
            _ = try Tokenizer(directory: url("warm-up")).encode("a")
        case .serve:
            // One request per endpoint first, so that what the server builds once (token tables, caches) is in place.
            for endpoint in Endpoint.allCases {
                let body = endpoint == .embeddings ? #"{"model": "clip-tiny", "input": "a cat"}"#
                    : endpoint == .completions ? #"{"model": "llava-tiny", "prompt": "Hi", "max_tokens": 2, "logprobs": 1}"#
                    : #"{"model": "llava-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stop": "x"}"#
                _ = try serve(endpoint, body: Data(body.utf8))
            }
        default: break
        }
    }

    func url(_ path: String) -> URL { root.appendingPathComponent(path) }

    /// A server over the tiny LLaVA chat model and the tiny CLIP (as the server tests load them), generation held to
    /// 4 tokens and 2 choices so that an input runs in milliseconds; image URLs other than data: ones are refused.
    func serveModels() throws -> VLMServer {
        if let server { return server }
        var configuration = ServerConfiguration()
        configuration.maxTokens = 4
        configuration.maxChoices = 2
        configuration.maxBatch = 2
        configuration.kvCacheBytes = 64 << 20
        let made = try VLMServer(models: [
            ServedModel.load(name: "llava-tiny", path: fixtures.appendingPathComponent("image-chat/llava-1.5"), configuration: configuration),
            ServedModel.load(name: "clip-tiny", path: fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax"), configuration: configuration),
        ], configuration: configuration)
        server = made
        return made
    }

    /// The server's answer to one body; a stream of events is drained.
    func serve(_ endpoint: Endpoint, body: Data) throws -> APIResponse {
        let server = try serveModels()
        let done = DispatchSemaphore(value: 0)
        let answer = AnswerBox()
        Task.detached {
            let response = await server.respond(to: endpoint, body: body)
            if case .events(let produce) = response {
                try? await produce { _ in }
            }
            answer.value = response
            done.signal()
        }
        done.wait()
        return answer.value ?? .failure(APIError(status: 500, message: "no answer", type: "server_error"))
    }

    @discardableResult
    func write(_ bytes: [UInt8], to path: String) throws -> URL {
        let url = url(path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(bytes).write(to: url)
        return url
    }

    /// The tokenizer of each model kind the project reads: byte-level BPE (CLIP, GPT-2's legacy files, SmolLM2),
    /// WordPiece (BERT), Unigram with Precompiled (T5-style) and SentencePiece BPE with byte fallback (Llama-style).
    func realTokenizers() throws -> [Tokenizer] {
        if let tokenizers { return tokenizers }
        let loaded = try ["tokenizers/clip", "tokenizers/real/gpt2", "tokenizers/real/smollm2", "tokenizers/real/bert-uncased",
                          "tokenizers/t5-style", "tokenizers/llama-style"]
            .map { try Tokenizer(directory: fixtures.appendingPathComponent($0)) }
        tokenizers = loaded
        return loaded
    }

    /// llava-1.5's published chat template.
    func llavaTemplate() throws -> ChatTemplate {
        if let template { return template }
        let loaded = try ChatTemplate.load(directory: fixtures.appendingPathComponent("image-chat/llava-1.5"))!
        template = loaded
        return loaded
    }

    /// A directory holding `config` as config.json beside the weights and other files of a tiny LLaVA checkpoint,
    /// whose config nests a vision and a text config, so that every field a loader reads is in reach.
    func checkpoint(config: [UInt8]) throws -> URL {
        let directory = url("checkpoint")
        let source = fixtures.appendingPathComponent("llava/llama-default-fp16")
        if !FileManager.default.fileExists(atPath: directory.path) {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            for name in try FileManager.default.contentsOfDirectory(atPath: source.path) where name != "config.json" {
                try FileManager.default.createSymbolicLink(at: directory.appendingPathComponent(name),
                                                           withDestinationURL: source.appendingPathComponent(name))
            }
        }
        try write(config, to: "checkpoint/config.json")
        return directory
    }

    static func build(_ builder: ModelBuilder, from directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        switch builder {
        case .imageTextDualEncoder(let build): _ = try build(checkpoint)
        case .causalLanguageModel(let build): _ = try build(checkpoint)
        case .imageToText(let build): _ = try build(checkpoint)
        case .imageTextMatching(let build): _ = try build(checkpoint)
        case .visualQuestionClassifier(let build): _ = try build(checkpoint)
        case .zeroShotSegmentation(let build): _ = try build(checkpoint)
        case .zeroShotObjectDetection(let build): _ = try build(checkpoint)
        }
    }

    static func exercise(_ tokenizer: Tokenizer) {
        for text in ["a photo of a cat", " Hello  world!\n\t½ Việt 日本語 🤗 <s></s>", ""] {
            let ids = tokenizer.encode(text, pair: text).ids
            _ = tokenizer.decode(ids)
            _ = tokenizer.decode(ids + [-1, Int(Int32.max), 0], skipSpecialTokens: true)
        }
    }

    /// Two users, an assistant with a reasoning turn and a tool call, text and image parts.
    static let conversation: [JSONValue] = [
        ["role": "system", "content": "You are helpful."],
        ["role": "user", "content": [["type": "image"], ["type": "text", "text": "What is this?"]]],
        ["role": "assistant", "content": "A cat.", "reasoning_content": "It has whiskers.",
         "tool_calls": [["type": "function", "function": ["name": "look", "arguments": ["x": 1]]]]],
        ["role": "tool", "content": "{\"ok\": true}"],
        ["role": "user", "content": "And this? <image>"],
    ]

    static let tools: JSONValue = [["type": "function", "function": ["name": "look", "description": "Looks.",
                                                                     "parameters": ["type": "object", "properties": ["x": ["type": "integer"]]]]]]

    /// Tools whose parameters a parsed reply's arguments are cast to (the seeds call these names).
    static let replyTools: [JSONValue] = ["look", "get_weather", "set_alarm", "fn", "special_function"].map { name in
        ["type": "function", "function": ["name": .string(name), "parameters": ["type": "object", "properties": [
            "x": ["type": "integer"], "city": ["type": ["string", "null"]], "days": ["type": "number"],
            "hour": ["anyOf": [["type": "integer"], ["type": "boolean"]]], "tags": ["type": "array"], "flag": ["type": "boolean"]]]]]
    }
}

/// Carries an answer out of the task that produced it.
private final class AnswerBox: @unchecked Sendable {
    var value: APIResponse?
}

extension FuzzWorkspace {
    /// Every byte as a token (byte b is token b + 1), pieces of JSON and text, and a few cut UTF-8 sequences; token 0
    /// ends generation.
    static let grammarTokenBytes: [[UInt8]] = [[]] + (0...255).map { [UInt8($0)] }
        + ["{\"", "\":", "\": ", ", \"", "true", "false", "null", "\n  ", "  ", "é", "→", "12", "-0.5e+3", "abc", "\\u00"].map { Array($0.utf8) }
        + [[0xC3], [0xE2, 0x86], [0xF0, 0x9F]]
    static let grammarVocabulary = GrammarVocabulary(tokenBytes: grammarTokenBytes, specialTokens: [0])

    /// Decoding under `grammar`: per step the allowed tokens, then the one `picks` selects among them (or an end).
    static func decode(under grammar: Grammar, picks: some Sequence<UInt8>) {
        let constraint = GrammarConstraint(grammar: grammar, vocabulary: grammarVocabulary, endTokens: [0])
        var state = grammar.initialState
        for pick in picks {
            let allowed = constraint.allowedTokens(state).enumerated().filter(\.element).map(\.offset)
            guard !allowed.isEmpty else { return }
            let token = allowed[Int(pick) % allowed.count]
            precondition(constraint.allows(token, after: state), "the mask and the single-token check disagree")
            state = constraint.state(after: token, from: state)
            if state.isDead { return }
        }
    }

    /// Decoding a reply under `template`'s tool-call constraint: each byte of `reply` where it is allowed, else the
    /// allowed token the byte selects (or an end).
    static func decodeToolCalls(_ template: ResponseTemplate, reply: [UInt8]) throws {
        guard let constraint = try ToolCallConstraint(template: template, tools: replyTools, prompt: "", tokenBytes: grammarTokenBytes,
                                                      grammarConstraint: { GrammarConstraint(grammar: $0, vocabulary: grammarVocabulary, endTokens: []) },
                                                      endTokens: [0]) else { return }
        let sequence = constraint.start()
        for byte in reply {
            var token = Int(byte) + 1
            if !sequence.allows(token) {
                var scores = [Float](repeating: 0, count: grammarTokenBytes.count)
                guard sequence.restrict(&scores) else { return }
                let allowed = scores.indices.filter { scores[$0] == 0 }
                precondition(!allowed.contains(token), "the mask and the single-token check disagree")
                token = allowed[Int(byte) % allowed.count]
                if token == 0 { return }
            }
            sequence.accept(token)
        }
    }
}

