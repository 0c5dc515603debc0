import Foundation
import Testing
import VLMCheckpoint

/// Runs the built `vlm` executable as a user would and reads what it prints.
struct CLI {
    struct Run {
        let status: Int32
        let stdout: String
        let stderr: String
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    /// The executable sits beside the test bundle in SwiftPM's build directory.
    static let executable: URL = {
        #if os(Linux)
        let bundle = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        #else
        let bundle = Bundle.allBundles.first { $0.bundlePath.hasSuffix(".xctest") }!.bundleURL
        #endif
        return bundle.deletingLastPathComponent().appendingPathComponent("vlm")
    }()

    static func run(_ arguments: [String], environment: [String: String] = [:], standardInput: URL? = nil,
                    directory: URL? = nil) throws -> Run {
        let process = Process()
        if let directory { process.currentDirectoryURL = directory }
        if let standardInput { process.standardInput = try FileHandle(forReadingFrom: standardInput) }
        process.executableURL = executable
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        // Read before waiting so a large output cannot fill the pipe and stall the child.
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Run(status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
                   stderr: String(decoding: stderr, as: UTF8.self))
    }

    static func json(_ run: Run) throws -> Any {
        try JSONSerialization.jsonObject(with: Data(run.stdout.utf8))
    }
}

@Suite struct CLITests {
    struct Expected: Decodable {
        struct Classified: Decodable { let image: String; let scores: [Score] }
        struct Score: Decodable { let label: String; let score: Double }
        let texts: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let photos: [String]
        let labels: [String]
        let template: String
        let zero_shot: [Classified]
    }

    let model = CLI.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
    let expected: Expected

    init() throws {
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: model.appendingPathComponent("expected.json")))
    }

    func photo(_ name: String) -> String { CLI.fixtures.appendingPathComponent("photos/\(name)").path }

    @Test func classifyPrintsTheTransformersPipelineScores() throws {
        let images = [photo("chelsea.png"), photo("rocket.jpg")]
        let run = try CLI.run(["classify"] + images + ["--model", model.path, "--labels", expected.labels.joined(separator: ","), "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.count == 2)
        for (result, image) in zip(results, images) {
            #expect(result["image"] as? String == image)
            let want = try #require(expected.zero_shot.first { image.hasSuffix($0.image) })
            let scores = try #require(result["scores"] as? [[String: Any]])
            #expect(scores.map { $0["label"] as? String } == want.scores.map(\.label))
            for (got, score) in zip(scores, want.scores) {
                #expect(abs((got["score"] as? Double ?? -1) - score.score) < 1e-4)
            }
        }
    }

    @Test func classifyPrintsARankedTable() throws {
        let run = try CLI.run(["classify", photo("coffee.png"), "--model", model.path, "--labels", "cat, coffee"])
        #expect(run.status == 0, "\(run.stderr)")
        let lines = run.stdout.split(separator: "\n")
        #expect(lines.count == 3)
        #expect(lines.first.map(String.init) == photo("coffee.png"))
    }

    /// Every photo against every templated label: transformers' `logits_per_image`, pair by pair in the order given.
    @Test func matchPrintsTheModelsLogitsPerImage() throws {
        let prompts = expected.labels.map { expected.template.replacingOccurrences(of: "{}", with: $0) }
        let run = try CLI.run(["match"] + expected.photos.map(photo) + ["--model", model.path, "--texts",
                               prompts.joined(separator: ","), "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let pairs = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(pairs.map { $0["image"] as? String } == expected.photos.flatMap { Array(repeating: photo($0), count: prompts.count) })
        #expect(pairs.map { $0["text"] as? String } == Array(repeating: prompts, count: expected.photos.count).flatMap { $0 })
        #expect(pairs.allSatisfy { Set($0.keys) == ["image", "text", "logit", "cosine"] })
        let logits = try SafetensorsFile(url: model.appendingPathComponent("expected.safetensors")).tensor("logits_per_image")
        #expect(logits.shape == [expected.photos.count, prompts.count])
        for (pair, want) in zip(pairs, logits.scalars) { #expect(abs((pair["logit"] as? Double ?? .nan) - Double(want)) < 1e-4) }

        let table = try CLI.run(["match", photo("coffee.png"), "--model", model.path, "--texts", "a cat, a cup of coffee"])
        #expect(table.status == 0, "\(table.stderr)")
        #expect(table.stdout.split(separator: "\n").map { $0.hasPrefix("  logit ") } == [false, true, true])
    }

    func embeddings(_ arguments: [String]) throws -> [[Double]] {
        let run = try CLI.run(["embed", "--model", model.path, "--json"] + arguments)
        #expect(run.status == 0, "\(run.stderr)")
        return try #require((try CLI.json(run) as? [String: Any])?["embeddings"] as? [[Double]])
    }

    func expectRows(_ rows: [[Double]], equal name: String, rows indices: [Int]) throws {
        let tensors = try SafetensorsFile(url: model.appendingPathComponent("expected.safetensors"))
        let expectedRows = try tensors.tensor(name)
        let width = expectedRows.shape[1]
        #expect(rows.count == indices.count)
        for (row, index) in zip(rows, indices) {
            let want = expectedRows.scalars[(index * width)..<((index + 1) * width)]
            #expect(row.count == width)
            #expect(zip(row, want).allSatisfy { abs($0 - Double($1)) < 1e-4 })
        }
    }

    @Test func embedTextsLikeGetTextFeatures() throws {
        try expectRows(embeddings(["--text"] + expected.texts), equal: "text_embeds", rows: Array(expected.texts.indices))
        for row in try embeddings(["--normalize", "--text"] + expected.texts) {
            #expect(abs(row.reduce(0) { $0 + $1 * $1 } - 1) < 1e-5)
        }
    }

    @Test func embedImagesLikeGetImageFeatures() throws {
        // chelsea.png and camera.png are photos 0 and 3 of the oracle's batch.
        try expectRows(embeddings(["--image", photo("chelsea.png"), photo("camera.png")]), equal: "image_embeds", rows: [0, 3])
    }

    @Test func tokenizeGivesIdsWithSpecialTokensAndNoPadding() throws {
        let run = try CLI.run(["tokenize", "--model", model.path, "--json"] + expected.texts)
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        for (index, result) in results.enumerated() where expected.attention_mask[index].last == 0 {
            // Rows the oracle padded show the unpadded ids as the ones under the attention mask.
            let unpadded = zip(expected.input_ids[index], expected.attention_mask[index]).filter { $0.1 == 1 }.map(\.0)
            #expect(result["text"] as? String == expected.texts[index])
            #expect(result["ids"] as? [Int] == unpadded)
        }
    }

    @Test func tokenizeRendersAChatLikeApplyChatTemplate() throws {
        struct Rendered: Decodable { let text: String; let ids: [Int] }
        let directory = CLI.fixtures.appendingPathComponent("chat-templates/cli")
        let want = try JSONDecoder().decode(Rendered.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let run = try CLI.run(["tokenize", "--model", directory.path, "--chat", directory.appendingPathComponent("messages.json").path,
                               "--add-generation-prompt", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let got = try JSONDecoder().decode(Rendered.self, from: Data(run.stdout.utf8))
        #expect(got.text == want.text)
        #expect(got.ids == want.ids)
    }

    /// `--assistant-mask`: return_assistant_tokens_mask=True's mask (oracle/assistant_masks.py) for SmolLM2's tokenizer
    /// under a template with `{% generation %}` blocks.
    @Test func tokenizeMarksTheAssistantsTokens() throws {
        struct Case: Decodable { let template: String; let messages: [[String: String]]; let input_ids: [Int]; let assistant_masks: [Int] }
        struct Expected: Decodable { let cases: [Case] }
        let fixtures = CLI.fixtures.appendingPathComponent("chat-templates/assistant-masks")
        let test = try #require(try JSONDecoder().decode(Expected.self, from: Data(contentsOf: fixtures.appendingPathComponent("expected.json"))).cases.first)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-assistant-mask-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for name in ["tokenizer.json", "tokenizer_config.json"] {
            try FileManager.default.copyItem(at: CLI.fixtures.appendingPathComponent("tokenizers/real/smollm2/\(name)"),
                                             to: directory.appendingPathComponent(name))
        }
        try FileManager.default.copyItem(at: fixtures.appendingPathComponent(test.template),
                                         to: directory.appendingPathComponent("chat_template.jinja"))
        let messages = directory.appendingPathComponent("messages.json")
        try JSONEncoder().encode(test.messages).write(to: messages)
        let run = try CLI.run(["tokenize", "--model", directory.path, "--chat", messages.path, "--json", "--assistant-mask"])
        #expect(run.status == 0, "\(run.stderr)")
        let got = try #require(try CLI.json(run) as? [String: Any])
        #expect(got["ids"] as? [Int] == test.input_ids)
        #expect(got["assistant_masks"] as? [Int] == test.assistant_masks)
        let withoutJSON = try CLI.run(["tokenize", "--model", directory.path, "--chat", messages.path, "--assistant-mask"])
        #expect(withoutJSON.status == 64 && withoutJSON.stderr.contains("--assistant-mask goes with --chat and --json"))
    }

    /// `vlm generate --chat --json` with a checkpoint whose tokenizer_config.json has a `response_template`: the reply
    /// also as the assistant message it parses into, as transformers' text-generation pipeline returns a chat's
    /// answer (a grammar holds the tiny random model to a reply in the template's format); a broken template is a
    /// one-line error naming the file.
    @Test func generateParsesChatRepliesWithTheResponseTemplate() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-response-template-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let checkpoint = CLI.fixtures.appendingPathComponent("sft/qwen2-chatml")
        // Files copied through their links (the fixture's tokenizer.json links to another fixture's).
        for name in try FileManager.default.contentsOfDirectory(atPath: checkpoint.path) {
            try FileManager.default.copyItem(at: checkpoint.appendingPathComponent(name).resolvingSymlinksInPath(),
                                             to: directory.appendingPathComponent(name))
        }
        let configURL = directory.appendingPathComponent("tokenizer_config.json")
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: configURL)) as? [String: Any])
        config["response_template"] = [
            "defaults": ["role": "assistant"], "start_anchor": "<|im_start|>assistant\n",
            "fields": ["reasoning_content": ["open": "<think>", "close": "</think>"],
                       "tool_calls": ["open_pattern": #"\s*<tool_call>"#, "close": "</tool_call>", "repeats": true, "content": "json",
                                      "transform": ["type": "function", "function": "{content}"]],
                       "content": ["close_pattern": #"\s*<\|im_end\|>"#]]] as [String: Any]
        try JSONSerialization.data(withJSONObject: config).write(to: configURL)
        let messages = directory.appendingPathComponent("messages.json")
        try Data(#"[{"role": "user", "content": "Weather in Oslo?"}]"#.utf8).write(to: messages)
        let grammar = directory.appendingPathComponent("reply.gbnf")
        try Data(#"root ::= "<think>Look it up.</think>On it.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": \"3\"}}</tool_call>""#.utf8).write(to: grammar)
        // The tools reach the template, and the string "3" becomes the integer the schema declares.
        let tools = directory.appendingPathComponent("tools.json")
        try Data(#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]"#.utf8).write(to: tools)
        let run = try CLI.run(["generate", "--model", directory.path, "--chat", messages.path, "--tools", tools.path,
                               "--grammar-file", grammar.path, "--temperature", "0", "--max-new-tokens", "80", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let got = try #require(try CLI.json(run) as? [String: Any])
        let message = try #require(got["message"] as? [String: Any], "\(run.stdout)")
        #expect(message["role"] as? String == "assistant")
        #expect(message["reasoning_content"] as? String == "Look it up.")
        #expect(message["content"] as? String == "On it.")
        let call = try #require((message["tool_calls"] as? [[String: Any]])?.first)
        #expect(call["type"] as? String == "function")
        let function = try #require(call["function"] as? [String: Any])
        #expect(function["name"] as? String == "get_weather")
        let arguments = try #require(function["arguments"] as? [String: Any])
        #expect(arguments["city"] as? String == "Oslo")
        #expect(arguments["days"] as? Int == 3)

        config["response_template"] = ["start_anchor": "x", "fields": ["content": ["content": "yaml"]]] as [String: Any]
        try JSONSerialization.data(withJSONObject: config).write(to: configURL)
        try CLIBadInputTests().expectOneLineError(["generate", "--model", directory.path, "--chat", messages.path, "--json"],
                                                  mentioning: "tokenizer_config.json: invalid response_template: Field 'content': unknown content parser 'yaml'")
    }

    /// `--chat-template FILE` renders the chat with that template in place of the checkpoint's (llama-cli's
    /// `--chat-template-file`); a file that does not parse is a one-line error naming it.
    @Test func generateTakesAChatTemplateFile() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-chat-template-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let checkpoint = CLI.fixtures.appendingPathComponent("sft/qwen2-chatml")
        let messages = directory.appendingPathComponent("messages.json")
        try Data(#"[{"role": "user", "content": "Weather in Oslo?"}]"#.utf8).write(to: messages)
        let template = directory.appendingPathComponent("plain.jinja")
        try Data("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}".utf8)
            .write(to: template)
        let run = try CLI.run(["generate", "--model", checkpoint.path, "--chat", messages.path, "--chat-template", template.path,
                               "--temperature", "0", "--max-new-tokens", "1", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let got = try #require(try CLI.json(run) as? [String: Any])
        let tokenized = try CLI.run(["tokenize", "--model", checkpoint.path, "--no-special-tokens", "--json", "[user] Weather in Oslo?\n[assistant] "])
        let ids = try #require(((try CLI.json(tokenized) as? [[String: Any]])?.first)?["ids"] as? [Int])
        #expect(got["prompt_tokens"] as? Int == ids.count)

        // --chat-template-kwargs: the template's variables, as llama.cpp's flag gives them.
        let greeting = directory.appendingPathComponent("greeting.jinja")
        try Data("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] {{ greeting | default('') }}".utf8)
            .write(to: greeting)
        let greeted = try CLI.run(["generate", "--model", checkpoint.path, "--chat", messages.path, "--chat-template", greeting.path,
                                   "--chat-template-kwargs", #"{"greeting": "Sunny and"}"#, "--temperature", "0",
                                   "--max-new-tokens", "1", "--json"])
        #expect(greeted.status == 0, "\(greeted.stderr)")
        let greetedTokens = try CLI.run(["tokenize", "--model", checkpoint.path, "--no-special-tokens", "--json",
                                         "[user] Weather in Oslo?\n[assistant] Sunny and"])
        let greetedIds = try #require(((try CLI.json(greetedTokens) as? [[String: Any]])?.first)?["ids"] as? [Int])
        #expect((try CLI.json(greeted) as? [String: Any])?["prompt_tokens"] as? Int == greetedIds.count)
        for bad in ["[1]", #"{"messages": []}"#] {
            try CLIBadInputTests().expectOneLineError(["generate", "--model", checkpoint.path, "--chat", messages.path,
                                                       "--chat-template-kwargs", bad], mentioning: "--chat-template-kwargs")
        }

        let broken = directory.appendingPathComponent("broken.jinja")
        try Data("{% for m in messages %}".utf8).write(to: broken)
        try CLIBadInputTests().expectOneLineError(["generate", "--model", checkpoint.path, "--chat", messages.path, "--chat-template", broken.path],
                                                  mentioning: broken.path)
    }

    @Test func tokenizeEncodesPairsLikeTokenizers() throws {
        struct Pairs: Decodable {
            /// Indices into the shared strings.
            struct Case: Decodable { let a: Int; let b: Int; let ids: [Int] }
            let pairs: [Case]
        }
        let fixtures = CLI.fixtures.appendingPathComponent("tokenizers")
        let texts = try JSONDecoder().decode([String].self, from: Data(contentsOf: fixtures.appendingPathComponent("real/strings.json")))
        let cases = try JSONDecoder().decode(Pairs.self, from: Data(contentsOf: fixtures.appendingPathComponent("cases/clip.json"))).pairs
        for pair in cases.prefix(5) {
            let run = try CLI.run(["tokenize", "--model", fixtures.appendingPathComponent("clip").path, "--json", "--pair", texts[pair.b], texts[pair.a]])
            #expect(run.status == 0, "\(run.stderr)")
            let result = try #require((try CLI.json(run) as? [[String: Any]])?.first)
            #expect(result["ids"] as? [Int] == pair.ids)
        }
    }

    @Test func tokenizeDecodesIds() throws {
        // The oracle's first text and its ids (special tokens included).
        let ids = zip(expected.input_ids[0], expected.attention_mask[0]).filter { $0.1 == 1 }.map { String($0.0) }
        let run = try CLI.run(["tokenize", "--model", model.path, "--decode", "--skip-special-tokens"] + ids)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == expected.texts[0] + "\n")
    }

    @Test func modelsByRepoIdComeFromTheHuggingFaceCacheOffline() throws {
        // A cache written by Python's huggingface_hub (oracle/hub_cache.py).
        let cache = ["HF_HUB_CACHE": CLI.fixtures.appendingPathComponent("hub/python-cache").path]
        let listed = try CLI.run(["cache", "list", "--json"], environment: cache)
        #expect(listed.status == 0, "\(listed.stderr)")
        let repos = try #require(try CLI.json(listed) as? [[String: Any]])
        #expect(repos.map { $0["repo"] as? String } == ["tiny-org/tiny-clip"])

        let run = try CLI.run(["classify", photo("chelsea.png"), "--model", "tiny-org/tiny-clip", "--offline", "--labels", "cat,dog", "--json"],
                              environment: cache)
        #expect(run.status == 0, "\(run.stderr)")
        let missing = try CLI.run(["classify", photo("chelsea.png"), "--model", "nobody/nothing", "--offline", "--labels", "cat"],
                                  environment: cache)
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("nobody/nothing"))
    }

    @Test func benchReportsMillisecondsPerImage() throws {
        let run = try CLI.run(["bench", "--model", model.path, "--batch-size", "2", "--runs", "2", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(report["task"] as? String == "image-embedding")
        #expect(report["batch_size"] as? Int == 2)
        #expect((report["ms_per_item"] as? Double ?? 0) > 0)
        #expect(report["dtype"] as? String == "fp32")
    }

    @Test func dtypeChoosesThePrecisionOfTheLinearLayers() throws {
        let bench = try CLI.run(["bench", "--model", model.path, "--runs", "1", "--dtype", "bf16", "--json"])
        #expect(bench.status == 0, "\(bench.stderr)")
        let report = try #require(try CLI.json(bench) as? [String: Any])
        // bf16 where the CPU multiplies it natively, else fp32 (the library's fallback, tested with the layers).
        #expect(["bf16", "fp32"].contains(report["dtype"] as? String ?? ""))
        for dtype in ["bf16", "int8"] {
            let embed = try CLI.run(["embed", "--model", model.path, "--dtype", dtype, "--image", photo("chelsea.png"), "--json"])
            #expect(embed.status == 0, "\(embed.stderr)")
        }
        let wrong = try CLI.run(["embed", "--model", model.path, "--dtype", "fp8", "--image", photo("chelsea.png")])
        #expect(wrong.status != 0)
        #expect(wrong.stderr.contains("fp8"))
    }
}

/// Bad input: one line on stderr naming the problem, exit status 1, nothing on stdout.
@Suite struct CLIBadInputTests {
    let model = CLI.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
    let photo = CLI.fixtures.appendingPathComponent("photos/chelsea.png").path

    func expectOneLineError(_ arguments: [String], mentioning needle: String) throws {
        let run = try CLI.run(arguments)
        #expect(run.status == 1)
        #expect(run.stdout.isEmpty)
        let lines = run.stderr.split(separator: "\n", omittingEmptySubsequences: true)
        #expect(lines.count == 1, "stderr: \(run.stderr)")
        #expect(run.stderr.contains(needle), "stderr: \(run.stderr)")
    }

    func temporaryDirectory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    @Test func missingImageFile() throws {
        try expectOneLineError(["classify", "/nonexistent/cat.jpg", "--model", model.path, "--labels", "a,b"], mentioning: "/nonexistent/cat.jpg")
    }

    @Test func directoryGivenAsImage() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try expectOneLineError(["classify", directory.path, "--model", model.path, "--labels", "a,b"], mentioning: "is a directory")
    }

    @Test func fileThatIsNotAnImage() throws {
        let notImage = model.appendingPathComponent("config.json").path
        try expectOneLineError(["classify", notImage, "--model", model.path, "--labels", "a,b"], mentioning: notImage)
    }

    @Test func truncatedImage() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let bytes = try Data(contentsOf: CLI.fixtures.appendingPathComponent("photos/rocket.jpg"))
        let truncated = directory.appendingPathComponent("truncated.jpg")
        try bytes.prefix(bytes.count / 3).write(to: truncated)
        try expectOneLineError(["classify", truncated.path, "--model", model.path, "--labels", "a,b"], mentioning: truncated.path)
    }

    @Test func directoryWithoutConfig() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try expectOneLineError(["classify", photo, "--model", directory.path, "--labels", "a,b"], mentioning: directory.path)
    }

    @Test func unsupportedModelType() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(#"{"model_type": "bert"}"#.utf8).write(to: directory.appendingPathComponent("config.json"))
        try expectOneLineError(["classify", photo, "--model", directory.path, "--labels", "a,b"], mentioning: "bert")
    }

    /// The registry knows every family's tasks: a command given a checkpoint of another family names the commands
    /// that family runs.
    @Test func checkpointOfAnotherFamilyNamesTheCommandsItRuns() throws {
        let opt = CLI.fixtures.appendingPathComponent("decoders/opt-pre").path
        try expectOneLineError(["classify", photo, "--model", opt, "--labels", "a,b"],
                               mentioning: "OPT checkpoint (model_type \"opt\") cannot run `vlm classify`; it runs with vlm generate, vlm chat")
        try expectOneLineError(["embed", "--model", opt, "--text", "a"], mentioning: "cannot run `vlm embed`")
        try expectOneLineError(["generate", "--model", model.path, "--prompt", "a"],
                               mentioning: "CLIP checkpoint (model_type \"clip\") cannot run `vlm generate`; it runs with vlm classify, vlm embed, vlm match")
        try expectOneLineError(["chat", "--model", model.path], mentioning: "cannot run `vlm chat`")
    }

    @Test func unsupportedImageProcessorNamesTheSupportedOnes() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        for file in try FileManager.default.contentsOfDirectory(atPath: model.path) {
            try FileManager.default.copyItem(at: model.appendingPathComponent(file), to: directory.appendingPathComponent(file))
        }
        let processor = directory.appendingPathComponent("preprocessor_config.json")
        try FileManager.default.removeItem(at: processor)
        try Data(#"{"image_processor_type": "Idefics3ImageProcessorFast"}"#.utf8).write(to: processor)
        try expectOneLineError(["classify", photo, "--model", directory.path, "--labels", "a,b"],
                               mentioning: "\(processor.path): image processor \"Idefics3ImageProcessorFast\" is not supported here (supported: BlipImageProcessor, CLIPImageProcessor")
    }

    @Test func emptyLabelList() throws {
        try expectOneLineError(["classify", photo, "--model", model.path, "--labels", " , "], mentioning: "label")
    }

    @Test func tokenizeRefusesAGGUFFileWithoutATokenizer() throws {
        let file = CLI.fixtures.appendingPathComponent("gguf/aligned64.gguf").path
        try expectOneLineError(["tokenize", "--model", file, "hello"], mentioning: file)
    }

    @Test func tokenizeRefusesAGGUFFileWithoutAChatTemplate() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let messages = directory.appendingPathComponent("messages.json")
        try Data(#"[{"role": "user", "content": "hi"}]"#.utf8).write(to: messages)
        let file = CLI.fixtures.appendingPathComponent("gguf-tokenizers/phi3-spm.gguf").path
        try expectOneLineError(["tokenize", "--model", file, "--chat", messages.path], mentioning: "no chat template")
    }
}

/// `vlm tokenize --model FILE.gguf`: the tokenizer and chat template from the file's metadata, as transformers loads
/// them with `gguf_file=` (fixtures by oracle/gguf_tokenizers.py).
@Suite struct CLIGGUFTokenizeTests {
    /// What oracle/gguf_tokenizers.py recorded for a GGUF written from a SentencePiece model (add_bos and add_eos on).
    struct GGUFExpected: Decodable {
        struct Pair: Decodable { let text: Int; let pair: Int; let ids: [Int] }
        struct Chat: Decodable { let messages: [[String: String]]; let add_generation_prompt: Bool; let text: String; let ids: [Int] }
        let ids: [[Int]]
        let ids_without_special: [[Int]?]
        let decoded: [String]
        let decoded_skip_special: [String?]
        let pairs: [Pair]
        let chats: [Chat]
    }

    var ggufFixtures: URL { CLI.fixtures.appendingPathComponent("gguf-tokenizers") }

    func ggufExpected() throws -> (GGUFExpected, [String]) {
        let expected = try JSONDecoder().decode(GGUFExpected.self, from: Data(contentsOf: ggufFixtures.appendingPathComponent("llama-spm.json")))
        let strings = try JSONDecoder().decode([String].self, from: Data(contentsOf: ggufFixtures.appendingPathComponent("strings.json")))
        return (expected, strings)
    }

    @Test func tokenizeTakesAGGUFFile() throws {
        let (expected, strings) = try ggufExpected()
        let texts = Array(strings[20..<30])
        let run = try CLI.run(["tokenize", "--model", ggufFixtures.appendingPathComponent("llama-spm.gguf").path, "--json"] + texts)
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.count == texts.count)
        for (index, result) in results.enumerated() {
            #expect(result["text"] as? String == texts[index])
            #expect(result["ids"] as? [Int] == expected.ids[20 + index])
        }
    }

    /// `--no-special-tokens` is `add_special_tokens=False`: this file adds bos and eos by default.
    @Test func tokenizeWithoutSpecialTokens() throws {
        let (expected, strings) = try ggufExpected()
        let texts = Array(strings[20..<30])
        let run = try CLI.run(["tokenize", "--model", ggufFixtures.appendingPathComponent("llama-spm.gguf").path, "--json",
                               "--no-special-tokens"] + texts)
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.count == texts.count)
        for (index, result) in results.enumerated() {
            let want = expected.ids_without_special[20 + index] ?? expected.ids[20 + index]
            #expect(want != expected.ids[20 + index])
            #expect(result["ids"] as? [Int] == want)
        }
        let refused = try CLI.run(["tokenize", "--model", ggufFixtures.appendingPathComponent("llama-spm.gguf").path,
                                   "--decode", "--no-special-tokens", "1"])
        #expect(refused.status != 0)
    }

    @Test func tokenizeEncodesPairsAndDecodesWithAGGUFFile() throws {
        let (expected, strings) = try ggufExpected()
        let model = ggufFixtures.appendingPathComponent("llama-spm.gguf").path
        // Arguments cannot hold NUL, and one starting with "-" would read as an option.
        func passable(_ text: String) -> Bool { !text.unicodeScalars.contains("\0") && !text.hasPrefix("-") }
        let pair = try #require(expected.pairs.first { passable(strings[$0.text]) && passable(strings[$0.pair]) })
        let encoded = try CLI.run(["tokenize", "--model", model, "--json", "--pair", strings[pair.pair], strings[pair.text]])
        #expect(encoded.status == 0, "\(encoded.stderr)")
        #expect((try CLI.json(encoded) as? [[String: Any]])?.first?["ids"] as? [Int] == pair.ids)
        let index = 20
        let ids = expected.ids[index].map(String.init)
        let decoded = try CLI.run(["tokenize", "--model", model, "--json", "--decode"] + ids)
        #expect((try CLI.json(decoded) as? [String: Any])?["text"] as? String == expected.decoded[index])
        let skipped = try CLI.run(["tokenize", "--model", model, "--json", "--decode", "--skip-special-tokens"] + ids)
        #expect((try CLI.json(skipped) as? [String: Any])?["text"] as? String
                == expected.decoded_skip_special[index] ?? expected.decoded[index])
    }

    @Test func tokenizeRendersTheChatTemplateOfAGGUFFile() throws {
        struct Rendered: Decodable { let text: String; let ids: [Int] }
        let (expected, _) = try ggufExpected()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for (index, chat) in expected.chats.enumerated() {
            let messages = directory.appendingPathComponent("messages\(index).json")
            try JSONSerialization.data(withJSONObject: chat.messages).write(to: messages)
            let run = try CLI.run(["tokenize", "--model", ggufFixtures.appendingPathComponent("llama-spm.gguf").path,
                                   "--chat", messages.path, "--json"] + (chat.add_generation_prompt ? ["--add-generation-prompt"] : []))
            #expect(run.status == 0, "\(run.stderr)")
            let got = try JSONDecoder().decode(Rendered.self, from: Data(run.stdout.utf8))
            #expect(got.text == chat.text)
            #expect(got.ids == chat.ids)
        }
    }
}
