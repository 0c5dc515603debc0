import Foundation
import SwiftVLM
import VLMServer

/// One reader of untrusted input, run on arbitrary bytes. Every input must end in a result or a thrown error: a
/// crash, a sanitizer report, a hang or a huge allocation is a finding.
enum FuzzTarget: String, CaseIterable {
    /// A .safetensors file: header, offsets, then every tensor read.
    case safetensors
    /// A .gguf file: header, metadata of every type, tensor directory, then every tensor dequantized and the
    /// tokenizer and chat template its metadata describes built and run.
    case gguf
    /// tokenizer.json, built into a tokenizer that then encodes and decodes a few strings.
    case tokenizer
    /// Text (the bytes as UTF-8, invalid sequences replaced) encoded and decoded by real tokenizers of each model kind.
    case text
    /// A chat template (lexer, parser, interpreter) rendering a conversation with images, tools and a reasoning turn.
    case template
    /// config.json placed beside a real tiny checkpoint's weights, loaded as the registry loads a model.
    case config
    /// JPEG, PNG, WebP, GIF, BMP or TIFF bytes decoded to RGB.
    case image
    /// A chat-messages JSON file as `vlm generate --chat` reads it, rendered through LLaVA's template, its images read.
    case chat
    /// A dataset's metadata, read as `vlm train` reads it: the first byte picks captions in an imagefolder
    /// directory's metadata.jsonl or metadata.csv (`lit`, `projector`), image conversations in its metadata.jsonl
    /// (`sft` of a LLaVA checkpoint), or text conversations in a JSON-lines file (`sft` of a language model).
    case dataset
    /// A GBNF grammar (first byte even) or a JSON schema (odd) as `vlm serve` reads `grammar` and `response_format`,
    /// then decoding under it over a small vocabulary: at each of up to 32 steps the mask of allowed tokens, and the
    /// allowed token the input's bytes pick taken.
    case grammar
    /// A response template (tokenizer_config.json's `response_template`) and a reply, split at the first NUL byte
    /// (without one, the whole input is a reply to one of transformers serve's templates): the reply generated under
    /// the template's tool-call constraint (its bytes where allowed, else an allowed token they pick), parsed whole,
    /// and streamed in chunks of sizes the input's bytes pick, as `vlm serve` parses replies.
    case response
    /// A request body for `vlm serve` (the first byte picks chat completions, completions or embeddings), answered
    /// by a server over tiny fixture models (generation capped at 4 tokens), streamed answers drained.
    case serve

    /// Runs one input; returns the error it was refused with, the expected answer to bad input.
    @discardableResult
    func run(_ bytes: [UInt8], in workspace: FuzzWorkspace) -> (any Error)? {
        do {
            switch self {
            case .safetensors:
                let file = try SafetensorsFile(url: workspace.write(bytes, to: "model.safetensors"))
                for name in file.tensorNames { _ = try? file.tensor(name) }
            case .gguf:
                let url = try workspace.write(bytes, to: "model.gguf")
                let file = try GGUFFile(url: url)
                for info in file.tensorInfos { _ = try? file.tensor(info.name) }
                let loaded = try loadTokenizer(path: url)
                FuzzWorkspace.exercise(loaded.tokenizer)
                _ = try loaded.chatTemplate?.render(messages: FuzzWorkspace.conversation, addGenerationPrompt: true)
            case .tokenizer:
                try workspace.write(bytes, to: "tokenizer/tokenizer.json")
                FuzzWorkspace.exercise(try Tokenizer(directory: workspace.url("tokenizer")))
            case .text:
                let text = String(decoding: bytes, as: UTF8.self)
                for tokenizer in try workspace.realTokenizers() {
                    let ids = tokenizer.encode(text, pair: text).ids
                    _ = tokenizer.decode(ids)
                    _ = tokenizer.decode(ids, skipSpecialTokens: true)
                }
            case .template:
                let template = try ChatTemplate(source: String(decoding: bytes, as: UTF8.self))
                _ = try template.render(messages: FuzzWorkspace.conversation, addGenerationPrompt: true,
                                        bosToken: "<s>", eosToken: "</s>", extraContext: ["tools": FuzzWorkspace.tools])
            case .config:
                let directory = try workspace.checkpoint(config: bytes)
                try FuzzWorkspace.build(ModelRegistry.family(of: ModelDirectory(url: directory)).builder, from: directory)
            case .image:
                // A few hundred bytes of RLE, CCITT G4 or deflate can declare millions of pixels, each converted
                // under AddressSanitizer's instrumentation (a 2-megapixel BMP from 273 bytes took 1.2 s unoptimized):
                // a megapixel at most keeps the hang check for slowness that is not the picture's size, and refusing
                // at the limit is exercised too.
                let image = try ImageDecoder.$maxPixels.withValue(1 << 20) { try ImageDecoder.decode(bytes, name: "input") }
                precondition(image.pixels.count == image.width * image.height * 3, "decoded buffer and size disagree")
            case .chat:
                guard case .array(let messages) = try JSONValue(parsing: Data(bytes), file: "messages.json") else { return nil }
                _ = try workspace.llavaTemplate().render(messages: messages, addGenerationPrompt: true)
                // Only images carried in the JSON itself: a fuzzer-made path could name any file on this machine.
                for reference in ChatImages.references(in: messages)
                where reference.key == "base64" || reference.value.hasPrefix("data:") {
                    _ = try? ChatImages.load(reference)
                }
            case .dataset:
                guard let first = bytes.first else { return nil }
                let directory = workspace.url("dataset")
                try? FileManager.default.removeItem(at: directory)
                try workspace.write([0x89, 0x50, 0x4E, 0x47], to: "dataset/a.png")
                try workspace.write(Array(bytes.dropFirst()), to: first % 4 == 1 ? "dataset/metadata.csv" : "dataset/metadata.jsonl")
                switch first % 4 {
                case 2: _ = try ImageConversationDataset(directory: directory)
                case 3: _ = try ConversationDataset(file: directory.appendingPathComponent("metadata.jsonl"))
                default: _ = try ImageTextDataset(directory: directory)
                }
            case .grammar:
                guard let first = bytes.first else { return nil }
                let text = Data(bytes.dropFirst())
                let grammar = first % 2 == 0
                    ? try Grammar(gbnf: String(decoding: text, as: UTF8.self))
                    : try Grammar(gbnf: JSONSchemaGrammar.convert(JSONValue(parsing: text, file: "schema.json")).grammar)
                FuzzWorkspace.decode(under: grammar, picks: bytes.suffix(32))
            case .response:
                let parts = bytes.split(separator: 0, maxSplits: 1, omittingEmptySubsequences: false)
                let template = parts.count == 2
                    ? try ResponseTemplate(JSONValue(parsing: Data(parts[0]), file: "response_template"))
                    : ResponseTemplate.servingFallback(modelType: ["qwen2", "qwen3_5", "gemma4"][bytes.count % 3])!
                let reply = Array(parts.last ?? [])
                try FuzzWorkspace.decodeToolCalls(template, reply: reply)
                let text = String(decoding: reply, as: UTF8.self)
                _ = try? template.parse(text, prefix: "<|im_start|>assistant\n<|turn>model\n", tools: FuzzWorkspace.replyTools)
                var parser = try ResponseParser(template: template, prefix: "", tools: FuzzWorkspace.replyTools)
                var rest = Array(text.unicodeScalars)[...]
                var pick = reply.makeIterator()
                while !rest.isEmpty {
                    let size = 1 + Int(pick.next() ?? 0) % 7
                    _ = try parser.feed(String(String.UnicodeScalarView(rest.prefix(size))))
                    rest = rest.dropFirst(size)
                }
                _ = try parser.finalize()
            case .serve:
                guard let first = bytes.first else { return nil }
                let endpoint = Endpoint.allCases[Int(first) % Endpoint.allCases.count]
                if case .failure(let error) = try workspace.serve(endpoint, body: Data(bytes.dropFirst())) { return error }
            }
            return nil
        } catch {
            return error
        }
    }
}
