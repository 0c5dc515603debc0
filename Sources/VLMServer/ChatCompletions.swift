import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Hummingbird
import SwiftVLM

extension VLMServer {
    /// `POST /v1/chat/completions`.
    func chatCompletion(_ body: Data) async throws -> APIResponse {
        let fields = try RequestFields(body)
        let model = try model(named: try fields.requiredString("model"))
        var requested = try SamplingFields(fields, configuration: configuration, maxTokensKeys: ["max_completion_tokens", "max_tokens"],
                                        pipeline: model.generationPipeline)
        let wantsLogprobs = try fields.bool("logprobs") ?? false
        let top = try fields.int("top_logprobs", in: 0...20)
        if top != nil && !wantsLogprobs { throw APIError.invalid("'top_logprobs' requires 'logprobs' to be true", param: "top_logprobs") }
        requested.logprobs = wantsLogprobs ? top ?? 0 : nil
        let toolRequest = try ToolRequest(fields)
        let templateArguments = try fields.chatTemplateArguments()
        let ending = try fields.promptEnding()
        let panAndScan = try fields.panAndScan()
        let parallelToolCalls = try fields.bool("parallel_tool_calls") ?? true
        if let forced = try toolRequest?.grammar() {
            guard requested.grammar == nil else {
                throw APIError.invalid("a forced tool call constrains the reply itself: no 'response_format', 'json_schema' or 'grammar' with it", param: "tool_choice")
            }
            requested.grammar = forced
        }
        let sampling = requested
        guard case .array(let raw)? = fields["messages"], !raw.isEmpty else {
            throw APIError.invalid("'messages' must be a non-empty array", param: "messages")
        }
        guard raw.count <= configuration.maxMessages else {
            throw APIError.invalid("'messages' holds \(raw.count) messages, more than the server's limit of \(configuration.maxMessages)", param: "messages")
        }

        let pipeline: TextGenerationPipeline, batcher: ContinuousBatcher
        let prompt: LanguageModelPrompt
        switch model.role {
        case let .text(text, textBatcher):
            if panAndScan.asked == true {
                throw APIError.invalid("The model `\(model.id)` reads no images: pan and scan is for Gemma 3", param: "mm_processor_kwargs")
            }
            let messages = templateToolCalls(try await chatMessages(raw, readsImages: false))
            (pipeline, batcher) = (text, textBatcher)
            let ids = try preparing {
                try text.promptIds(messages: messages, tools: toolRequest?.tools, templateArguments: templateArguments,
                                   addGenerationPrompt: ending.addGenerationPrompt, continueFinalMessage: ending.continueFinalMessage)
            }
            prompt = LanguageModelPrompt(ids: ids)
        case let .imageChat(served, chatBatcher):
            let imageChat: ImageTextToTextPipeline
            do {
                // The server's default reaches only the models that crop so; a request's own choice is checked.
                let crops = panAndScan.asked ?? (configuration.panAndScan && served.processor is Gemma3Processor)
                imageChat = crops ? try served.withPanAndScan(panAndScan.settings) : served
            } catch let error as PipelineError {
                throw APIError.invalid("The model `\(model.id)`: \(error)", param: "mm_processor_kwargs")
            }
            let messages = templateToolCalls(try await chatMessages(raw, readsImages: true))
            (pipeline, batcher) = (imageChat.text, chatBatcher)
            var arguments = templateArguments
            if let tools = toolRequest?.tools { arguments["tools"] = .array(tools) }
            // Reading and encoding images is heavy: off the server's event loops.
            prompt = try await heavyWork.run(maxImagePixels: configuration.maxImagePixels) { [arguments] in
                try preparing {
                    try imageChat.prompt(messages: messages, templateArguments: arguments, addGenerationPrompt: ending.addGenerationPrompt,
                                         continueFinalMessage: ending.continueFinalMessage)
                }
            }
        case .embeddings:
            throw APIError.invalid("The model `\(model.id)` computes embeddings; it does not chat", param: "model")
        }
        // Replies are parsed with the model's response template (content, reasoning, tool calls), as transformers serve
        // parses them, unless the request forces a call (its reply is the call) or asks for no tools.
        let forced = toolRequest?.forcesCall ?? false
        let template = forced || toolRequest?.choice == ToolRequest.Choice.none ? nil : model.responseTemplate
        if toolRequest?.choice == .auto && template == nil {
            throw APIError.invalid(
                "tool_choice \"auto\" (the default with tools) needs the model's tool-call format, which `\(model.id)` does not declare (no response_template in its tokenizer_config.json, and transformers serve has none for its model type; start the server with --response-template FILE): ask for \"required\" or a named function (the reply is then constrained to the tools' schemas), or \"none\"",
                param: "tool_choice")
        }
        let promptText = template == nil ? "" : pipeline.tokenizer.decode(prompt.ids, skipSpecialTokens: false)
        func replyParsers() throws -> [ReplyParser]? {
            try template.map { template in
                try (0..<sampling.n).map { _ in
                    try ReplyParser(template: template, prompt: promptText, tools: toolRequest?.tools, parallelToolCalls: parallelToolCalls)
                }
            }
        }
        // Calls the model makes on its own are held to the tools' schemas in its format, the rest of the reply free (as
        // llama-server's lazy grammars hold them), unless the request constrains the whole reply.
        let toolCalls: ((GenerationConfig) throws -> (any GenerationConstraint)?)?
        if let toolRequest, toolRequest.choice == .auto, let template {
            toolCalls = { settings in
                do {
                    return try pipeline.toolCallConstraint(tools: toolRequest.tools, promptIds: prompt.ids, settings: settings,
                                                           template: template, parallelCalls: parallelToolCalls)
                } catch let error as GrammarError {
                    throw APIError.invalid("\(error)", param: "tools")
                } catch {
                    throw APIError.invalid("\(error)", param: "messages")
                }
            }
        } else {
            toolCalls = nil
        }
        let run = try GenerationRun(model: model, pipeline: pipeline, batcher: batcher, prompt: prompt, fields: sampling,
                                    configuration: configuration, otherConstraint: toolCalls)
        let id = "chatcmpl-" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        let created = Int(Date().timeIntervalSince1970)
        let stops = sampling.stop
        let tokenTable = sampling.logprobs != nil ? TokenStrings.shared.bytes(pipeline) : []
        let metrics = metrics
        let start = ContinuousClock.now

        @Sendable func chunk(_ choices: [JSONValue], usage: JSONValue? = nil) -> JSONValue {
            var object: [(String, JSONValue)] = [("id", .string(id)), ("object", "chat.completion.chunk"), ("created", .int(created)),
                                                 ("model", .string(model.id)), ("system_fingerprint", .null), ("choices", .array(choices))]
            if sampling.includeUsage { object.append(("usage", usage ?? .null)) }
            return .object(object)
        }
        @Sendable func logprobs(_ token: BatchToken) -> JSONValue {
            var entry = logprobEntry(token.id, token.logprob ?? 0, tokenTable)
            if case .object(var pairs) = entry {
                pairs.append(("top_logprobs", .array(token.topLogprobs.map { logprobEntry($0.id, $0.logprob, tokenTable) })))
                entry = .object(pairs)
            }
            return entry
        }

        if sampling.stream {
            let startingReplies = try replyParsers()
            return .events { send in
                var replies = startingReplies
                var progress = RunProgress(run, choices: sampling.n, stops: stops, metrics: metrics, start: start,
                                           keepSpecialTokens: template != nil)
                var heldText = Array(repeating: "", count: sampling.n)
                /// Sends what a parsed piece adds: reasoning, then content (with the token's logprobs), then each call.
                func sendReply(_ delta: ReplyDelta, choice: Int, calls: Int, logprob: JSONValue?) async throws {
                    if !delta.reasoning.isEmpty {
                        try await send(chunk([["index": .int(choice), "delta": ["reasoning_content": .string(delta.reasoning)],
                                               "logprobs": .null, "finish_reason": .null]]))
                    }
                    if !delta.content.isEmpty || logprob != nil {
                        try await send(chunk([["index": .int(choice), "delta": ["content": .string(delta.content)],
                                               "logprobs": logprob ?? .null, "finish_reason": .null]]))
                    }
                    for (offset, call) in delta.toolCalls.enumerated() {
                        guard case .object(let fields) = call else { continue }
                        let indexed: JSONValue = .object([("index", .int(calls - delta.toolCalls.count + offset))] + fields)
                        try await send(chunk([["index": .int(choice), "delta": ["tool_calls": [indexed]],
                                               "logprobs": .null, "finish_reason": .null]]))
                    }
                }
                for choice in 0..<sampling.n {
                    try await send(chunk([["index": .int(choice), "delta": ["role": "assistant", "content": ""],
                                           "logprobs": .null, "finish_reason": .null]]))
                }
                for try await (choice, event) in run.events() {
                    switch progress.take(choice, event) {
                    case nil: continue
                    case .token(let token, let piece)?:
                        if forced {
                            // A forced call is sent whole once it is complete.
                            heldText[choice] += piece
                        } else if replies != nil {
                            let delta = try replies![choice].take(piece)
                            try await sendReply(delta, choice: choice, calls: replies![choice].callCount,
                                                logprob: sampling.logprobs != nil ? ["content": [logprobs(token)]] : nil)
                        } else if !piece.isEmpty || sampling.logprobs != nil {
                            let logprob: JSONValue = sampling.logprobs != nil ? ["content": [logprobs(token)]] : .null
                            try await send(chunk([["index": .int(choice), "delta": ["content": .string(piece)],
                                                   "logprobs": logprob, "finish_reason": .null]]))
                        }
                    case .finished(let rest, var reason)?:
                        if replies != nil {
                            let last = try replies![choice].finish(rest).last
                            try await sendReply(last, choice: choice, calls: replies![choice].callCount, logprob: nil)
                            if replies![choice].callCount > 0 { reason = "tool_calls" }
                        } else if let toolRequest, forced {
                            let text = heldText[choice] + rest
                            let delta: JSONValue = toolRequest.calls(in: text).map { calls in
                                ["tool_calls": .array(calls.enumerated().map { index, call in
                                    guard case .object(let fields) = call else { return call }
                                    return .object([("index", .int(index))] + fields)
                                })]
                            } ?? ["content": .string(text)]
                            try await send(chunk([["index": .int(choice), "delta": delta, "logprobs": .null,
                                                   "finish_reason": .null]]))
                        } else if !rest.isEmpty {
                            try await send(chunk([["index": .int(choice), "delta": ["content": .string(rest)],
                                                   "logprobs": .null, "finish_reason": .null]]))
                        }
                        try await send(chunk([["index": .int(choice), "delta": [:], "logprobs": .null,
                                               "finish_reason": .string(reason)]]))
                    }
                }
                run.countTokens(metrics, completion: progress.completionTokens)
                if sampling.includeUsage {
                    try await send(chunk([], usage: usage(prompt: run.promptLength, completion: progress.completionTokens,
                                                          cached: progress.cachedTokens)))
                }
            }
        }

        var progress = RunProgress(run, choices: sampling.n, stops: stops, metrics: metrics, start: start,
                                   keepSpecialTokens: template != nil)
        var contents = Array(repeating: "", count: sampling.n)
        var reasons = Array(repeating: "length", count: sampling.n)
        var tokenLogprobs = Array(repeating: [JSONValue](), count: sampling.n)
        for try await (choice, event) in run.events() {
            switch progress.take(choice, event) {
            case nil: continue
            case .token(let token, let piece)?:
                contents[choice] += piece
                if sampling.logprobs != nil { tokenLogprobs[choice].append(logprobs(token)) }
            case .finished(let rest, let reason)?:
                contents[choice] += rest
                reasons[choice] = reason
            }
        }
        run.countTokens(metrics, completion: progress.completionTokens)
        var replies = try replyParsers()
        let choices: [JSONValue] = try (0..<sampling.n).map { choice in
            let message: JSONValue
            if replies != nil {
                let reply = try replies![choice].finish(contents[choice]).message
                var fields: [(String, JSONValue)] = [("role", "assistant")]
                // Content null beside tool calls, as OpenAI sends it.
                fields.append(("content", reply.content.isEmpty && !reply.toolCalls.isEmpty ? .null : .string(reply.content)))
                if !reply.reasoning.isEmpty { fields.append(("reasoning_content", .string(reply.reasoning))) }
                if !reply.toolCalls.isEmpty {
                    fields.append(("tool_calls", .array(reply.toolCalls)))
                    reasons[choice] = "tool_calls"
                }
                message = .object(fields)
            } else {
                // A forced call that came out whole is the message's tool_calls (content null, as OpenAI sends it).
                message = toolRequest?.calls(in: contents[choice]).map {
                    ["role": "assistant", "content": .null, "tool_calls": .array($0)]
                } ?? ["role": "assistant", "content": .string(contents[choice])]
            }
            return ["index": .int(choice), "message": message,
                    "logprobs": sampling.logprobs != nil ? ["content": .array(tokenLogprobs[choice])] : .null,
                    "finish_reason": .string(reasons[choice])]
        }
        return .json(["id": .string(id), "object": "chat.completion", "created": .int(created), "model": .string(model.id),
                      "system_fingerprint": .null, "choices": .array(choices),
                      "usage": usage(prompt: run.promptLength, completion: progress.completionTokens, cached: progress.cachedTokens)])
    }

    /// OpenAI's messages in the form chat templates read (transformers' format): text parts kept (joined into one
    /// string for models that read no images, whose templates expect one), `image_url` parts turned into
    /// `{"type": "image", "url": …}` once the URL passes the server's policy.
    func chatMessages(_ messages: [JSONValue], readsImages: Bool) async throws -> [JSONValue] {
        var converted: [JSONValue] = []
        for (index, message) in messages.enumerated() {
            guard case .object(var pairs) = message, case .string? = message["role"] else {
                throw APIError.invalid("messages[\(index)] must be an object with a string 'role'", param: "messages")
            }
            switch message["content"] {
            case nil, .null?, .string?: break
            case .array(let parts)?:
                var newParts: [JSONValue] = []
                for (partIndex, part) in parts.enumerated() {
                    let place = "messages[\(index)].content[\(partIndex)]"
                    switch part["type"] {
                    case .string("text")?:
                        guard case .string(let text)? = part["text"] else { throw APIError.invalid("\(place) needs a string 'text'", param: "messages") }
                        newParts.append(["type": "text", "text": .string(text)])
                    case .string("image_url")?:
                        guard readsImages else {
                            throw APIError.invalid("\(place): this model reads no images", param: "messages")
                        }
                        let url: String
                        switch part["image_url"] {
                        case .string(let text)?: url = text
                        case .object?:
                            guard case .string(let text)? = part["image_url"]?["url"] else {
                                throw APIError.invalid("\(place) needs 'image_url.url'", param: "messages")
                            }
                            url = text
                        default: throw APIError.invalid("\(place) needs 'image_url.url'", param: "messages")
                        }
                        newParts.append(try await imagePart(url, place: place))
                    default:
                        throw APIError.invalid("\(place): unsupported content part type (text and image_url are)", param: "messages")
                    }
                }
                let replaced: JSONValue
                if readsImages {
                    replaced = .array(newParts)
                } else {
                    replaced = .string(newParts.compactMap { part -> String? in
                        if case .string(let text)? = part["text"] { return text }
                        return nil
                    }.joined(separator: "\n"))
                }
                if let at = pairs.firstIndex(where: { $0.0 == "content" }) { pairs[at].1 = replaced }
            default:
                throw APIError.invalid("messages[\(index)].content must be a string or an array of content parts", param: "messages")
            }
            converted.append(.object(pairs))
        }
        return converted
    }

    /// An image part for the chat template and the pipeline, by the server's URL policy: data URLs always;
    /// `file://` only under --allow-local-files; web URLs only with --allow-remote-images, downloaded here.
    private func imagePart(_ url: String, place: String) async throws -> JSONValue {
        if url.hasPrefix("data:") {
            return ["type": "image", "url": .string(url)]
        }
        if url.hasPrefix("file:") {
            guard let root = configuration.allowLocalFiles else {
                throw APIError.invalid("\(place): file:// image URLs are refused (start the server with --allow-local-files DIR)", param: "messages")
            }
            guard let fileURL = URL(string: url), fileURL.isFileURL else { throw APIError.invalid("\(place): not a valid file URL", param: "messages") }
            let resolved = fileURL.standardizedFileURL.resolvingSymlinksInPath().path
            let allowed = root.standardizedFileURL.resolvingSymlinksInPath().path
            guard resolved.hasPrefix(allowed.hasSuffix("/") ? allowed : allowed + "/") else {
                throw APIError.invalid("\(place): \(fileURL.path) is outside the directory the server reads images from", param: "messages")
            }
            return ["type": "image", "url": .string(URL(fileURLWithPath: resolved).absoluteString)]
        }
        if url.hasPrefix("http://") || url.hasPrefix("https://") {
            guard configuration.allowRemoteImages else {
                throw APIError.invalid("\(place): remote image URLs are refused (start the server with --allow-remote-images, or send a data: URL)", param: "messages")
            }
            guard let remote = URL(string: url) else { throw APIError.invalid("\(place): not a valid URL", param: "messages") }
            let data = try await download(remote, place: place)
            return ["type": "image", "base64": .string(data.base64EncodedString())]
        }
        throw APIError.invalid("\(place): image URLs must be data:, file:// or http(s):// URLs", param: "messages")
    }

    private func download(_ url: URL, place: String) async throws -> Data {
        var request = URLRequest(url: url)
        request.timeoutInterval = 30
        let data: Data, response: URLResponse
        do { (data, response) = try await URLSession.shared.data(for: request) } catch {
            throw APIError.invalid("\(place): the image could not be downloaded: \(error.localizedDescription)", param: "messages")
        }
        guard let status = (response as? HTTPURLResponse)?.statusCode, status == 200 else {
            throw APIError.invalid("\(place): the image URL answered \((response as? HTTPURLResponse)?.statusCode ?? 0)", param: "messages")
        }
        guard data.count <= configuration.maxRemoteImageBytes else {
            throw APIError.invalid("\(place): the image is larger than \(configuration.maxRemoteImageBytes) bytes", param: "messages")
        }
        return data
    }
}

/// Runs prompt preparation, turning its errors (templates, images, tokenization) into 400s: they are the request's.
func preparing<T>(_ work: () throws -> T) throws -> T {
    do { return try work() } catch let error as APIError { throw error } catch {
        throw APIError.invalid("\(error)", param: "messages")
    }
}

/// OpenAI's usage object; `cached` prompt tokens came from a kept prefix (`prompt_tokens_details.cached_tokens`).
func usage(prompt: Int, completion: Int, cached: Int = 0) -> JSONValue {
    ["prompt_tokens": .int(prompt), "completion_tokens": .int(completion), "total_tokens": .int(prompt + completion),
     "prompt_tokens_details": ["cached_tokens": .int(cached)]]
}
