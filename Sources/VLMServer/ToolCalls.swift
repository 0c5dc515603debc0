import Foundation
import SwiftVLM

/// A chat request's `tools` and `tool_choice`. The tools go to the chat template (as `apply_chat_template(tools=…)`).
/// `"auto"` (the default) lets the model call them in its own format, recognized in its reply by the model's
/// response template (as transformers serve does; the server refuses `"auto"` for a model without one, as vLLM does
/// without a tool-call parser). A forced call (`"required"` or a named function) constrains the reply to JSON of
/// the tools' schemas (structured outputs, as vLLM forces one), whatever the model's own format.
struct ToolRequest {
    enum Choice: Equatable {
        /// The tools are shown to the model, which answers in text.
        case none
        /// The model calls tools in its own format, or answers in text.
        case auto
        /// At least one call to any of the tools: a JSON array of `{"name", "parameters"}`.
        case required
        /// One call to this function: its arguments as JSON of its parameters' schema.
        case function(String)
    }

    /// The tools as given (`{"type": "function", "function": {"name", "description", "parameters"}}`).
    let tools: [JSONValue]
    let choice: Choice

    /// Reads `tools` and `tool_choice`; nil when the request has no tools.
    init?(_ fields: RequestFields) throws {
        let choiceField = fields["tool_choice"]
        guard let toolsField = fields["tools"] else {
            if choiceField != nil { throw APIError.invalid("'tool_choice' is only allowed when 'tools' are given", param: "tool_choice") }
            return nil
        }
        guard case .array(let tools) = toolsField, !tools.isEmpty else {
            throw APIError.invalid("'tools' must be a non-empty array", param: "tools")
        }
        var names: [String] = []
        for (index, tool) in tools.enumerated() {
            guard tool["type"] == .string("function"), case .object? = tool["function"],
                  case .string(let name)? = tool["function"]?["name"], !name.isEmpty else {
                throw APIError.invalid("tools[\(index)] must be {\"type\": \"function\", \"function\": {\"name\": …}}", param: "tools")
            }
            switch tool["function"]?["parameters"] {
            case nil, .object?: break
            default: throw APIError.invalid("tools[\(index)].function.parameters must be a JSON schema object", param: "tools")
            }
            names.append(name)
        }
        self.tools = tools
        switch choiceField {
        case .string("none")?:
            choice = .none
        case .string("required")?:
            choice = .required
        case nil, .string("auto")?:
            choice = .auto
        case .object?:
            guard choiceField?["type"] == .string("function"), case .string(let name)? = choiceField?["function"]?["name"] else {
                throw APIError.invalid("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}", param: "tool_choice")
            }
            guard names.contains(name) else { throw APIError.invalid("tool_choice names '\(name)', which is not among the tools", param: "tool_choice") }
            choice = .function(name)
        default:
            throw APIError.invalid("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}", param: "tool_choice")
        }
    }

    /// A function's parameters, or an object without properties where it declares none.
    private func parameters(of tool: JSONValue) -> JSONValue {
        tool["function"]?["parameters"] ?? ["type": "object", "properties": .object([])]
    }

    /// The JSON schema a forced call's reply follows (vLLM's): a function's parameters, or for `required` an array
    /// of at least one `{"name": one of the tools, "parameters": its parameters}`.
    var schema: JSONValue? {
        switch choice {
        case .none, .auto:
            return nil
        case .function(let name):
            return tools.first { $0["function"]?["name"] == .string(name) }.map(parameters)
        case .required:
            let calls: [JSONValue] = tools.map { tool in
                ["properties": ["name": ["type": "string", "enum": [tool["function"]?["name"] ?? .null]],
                                "parameters": parameters(of: tool)],
                 "required": ["name", "parameters"]]
            }
            return ["type": "array", "minItems": 1, "items": ["type": "object", "anyOf": .array(calls)]]
        }
    }

    /// The grammar of ``schema``, converted as llama.cpp converts schemas.
    func grammar() throws -> Grammar? {
        guard let schema else { return nil }
        do { return try Grammar(gbnf: JSONSchemaGrammar.convert(schema).grammar) } catch {
            throw APIError.invalid("\(error)", param: "tools")
        }
    }

    /// The calls a forced reply makes, as OpenAI's `tool_calls` (arguments as JSON text); nil when the reply is not
    /// a whole call (generation was cut short).
    func calls(in text: String) -> [JSONValue]? {
        switch choice {
        case .none, .auto:
            return nil
        case .function(let name):
            guard (try? JSONValue(parsing: Data(text.utf8))) != nil else { return nil }
            return [Self.call(name: name, arguments: text.trimmingCharacters(in: .whitespacesAndNewlines))]
        case .required:
            guard case .array(let items)? = try? JSONValue(parsing: Data(text.utf8)) else { return nil }
            return items.compactMap { item in
                guard case .string(let name)? = item["name"], let parameters = item["parameters"] else { return nil }
                return Self.call(name: name, arguments: String(decoding: JSONWriter.data(parameters), as: UTF8.self))
            }
        }
    }

    /// Whether the reply is constrained to a call.
    var forcesCall: Bool {
        switch choice {
        case .required, .function: true
        case .none, .auto: false
        }
    }

    static func call(name: String, arguments: String) -> JSONValue {
        ["id": .string("call_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(24)),
         "type": "function", "function": ["name": .string(name), "arguments": .string(arguments)]]
    }
}

extension VLMServer {
    /// Earlier turns' `tool_calls` as chat templates read them (transformers' format: `arguments` an object, where
    /// OpenAI sends JSON text), as vLLM passes them on; such a turn's null content becomes "" (OpenAI sends null,
    /// and a null key is dropped before rendering, which templates that read every message's content refuse).
    func templateToolCalls(_ messages: [JSONValue]) -> [JSONValue] {
        messages.map { message in
            guard case .object(var pairs) = message, case .array(let calls)? = message["tool_calls"],
                  let at = pairs.firstIndex(where: { $0.0 == "tool_calls" }) else { return message }
            if let content = pairs.firstIndex(where: { $0.0 == "content" }) {
                if pairs[content].1 == .null { pairs[content].1 = "" }
            } else {
                pairs.append(("content", ""))
            }
            pairs[at].1 = .array(calls.map { call in
                guard case .object(var fields) = call, case .object(var function)? = call["function"],
                      case .string(let text)? = call["function"]?["arguments"],
                      let arguments = try? JSONValue(parsing: Data(text.utf8)),
                      let functionAt = fields.firstIndex(where: { $0.0 == "function" }),
                      let argumentsAt = function.firstIndex(where: { $0.0 == "arguments" }) else { return call }
                function[argumentsAt].1 = arguments
                fields[functionAt].1 = .object(function)
                return .object(fields)
            })
            return .object(pairs)
        }
    }
}

extension RequestFields {
    /// How the prompt ends: vLLM's `add_generation_prompt` (default true) and `continue_final_message` (default
    /// false); with neither set, a conversation whose last message is the assistant's is continued, a reply the client
    /// began (llama-server's assistant prefill).
    func promptEnding() throws -> (addGenerationPrompt: Bool, continueFinalMessage: Bool) {
        let addGenerationPrompt = try bool("add_generation_prompt")
        let continueFinalMessage = try bool("continue_final_message")
        guard case let .array(messages)? = self["messages"], let last = messages.last else {
            return (addGenerationPrompt ?? true, continueFinalMessage ?? false)
        }
        var ending = (addGenerationPrompt: addGenerationPrompt ?? true, continueFinalMessage: continueFinalMessage ?? false)
        if addGenerationPrompt == nil && continueFinalMessage == nil && last["role"] == .string("assistant") {
            if messages.count >= 2 && messages[messages.count - 2]["role"] == .string("assistant") {
                throw APIError.invalid("Cannot have 2 or more assistant messages at the end of the list.", param: "messages")
            }
            ending = (false, true)
        }
        guard ending.continueFinalMessage else { return ending }
        if ending.addGenerationPrompt {
            throw APIError.invalid("Cannot set both add_generation_prompt and continue_final_message to true.", param: "continue_final_message")
        }
        if case let .array(calls)? = last["tool_calls"], !calls.isEmpty {
            throw APIError.invalid("Cannot continue an assistant message that contains tool calls.", param: "messages")
        }
        return ending
    }

    /// `mm_processor_kwargs` (vLLM's: settings for the model's processor): Gemma 3's pan and scan, on or off as
    /// `do_pan_and_scan` says (`asked`, nil where it is not given) and shaped by `pan_and_scan_min_crop_size`,
    /// `pan_and_scan_max_num_crops` and `pan_and_scan_min_ratio_to_activate` as transformers' processor takes them.
    func panAndScan() throws -> (asked: Bool?, settings: PanAndScan) {
        let param = "mm_processor_kwargs"
        var on: Bool?, settings = PanAndScan()
        guard let value = self[param] else { return (on, settings) }
        guard case .object(let pairs) = value else { throw APIError.invalid("'\(param)' must be an object", param: param) }
        for (key, setting) in pairs where setting != .null {
            switch (key, setting) {
            case ("do_pan_and_scan", .bool(let flag)): on = flag
            case ("pan_and_scan_min_crop_size", .int(let size)) where size > 0: settings.minCropSize = size
            case ("pan_and_scan_max_num_crops", .int(let count)) where count > 0: settings.maxCrops = count
            case ("pan_and_scan_min_ratio_to_activate", .int(let ratio)): settings.minRatioToActivate = Double(ratio)
            case ("pan_and_scan_min_ratio_to_activate", .double(let ratio)) where ratio.isFinite: settings.minRatioToActivate = ratio
            case ("do_pan_and_scan", _), ("pan_and_scan_min_crop_size", _), ("pan_and_scan_max_num_crops", _),
                 ("pan_and_scan_min_ratio_to_activate", _):
                throw APIError.invalid("'\(param).\(key)' must be \(key == "do_pan_and_scan" ? "a boolean" : key.hasSuffix("ratio_to_activate") ? "a finite number" : "a positive integer")", param: param)
            default:
                throw APIError.invalid("'\(param)' may hold Gemma 3's do_pan_and_scan, pan_and_scan_min_crop_size, pan_and_scan_max_num_crops and pan_and_scan_min_ratio_to_activate, not '\(key)'", param: param)
            }
        }
        return (on, settings)
    }

    /// `chat_template_kwargs` (vLLM's, llama-server's and transformers serve's): more variables for the chat template,
    /// as `apply_chat_template(**kwargs)` takes them (Qwen 3's `enable_thinking`, …). The variables the server sets
    /// itself may not be overridden.
    func chatTemplateArguments() throws -> [String: JSONValue] {
        guard let value = self["chat_template_kwargs"], value != .null else { return [:] }
        guard case .object(let pairs) = value else {
            throw APIError.invalid("'chat_template_kwargs' must be an object", param: "chat_template_kwargs")
        }
        var arguments: [String: JSONValue] = [:]
        for (key, argument) in pairs {
            guard !["messages", "tools", "documents", "add_generation_prompt"].contains(key) else {
                throw APIError.invalid("chat_template_kwargs may not set '\(key)' (the request's own fields set it)", param: "chat_template_kwargs")
            }
            arguments[key] = argument
        }
        return arguments
    }
}
