import Foundation

/// A rendered conversation and where the template's `{% generation %}` blocks put their text.
public struct RenderedChat: Sendable, Equatable {
    public let text: String
    /// Each block's text as a range of Unicode scalar offsets (Python's str indices) into `text`, as transformers'
    /// AssistantTracker records it: from the length of the template's output when the block ends (inside a macro
    /// or a `set` or `filter` block, the output before it, as in jinja2), for the length of the block's text.
    public let generations: [Range<Int>]
}

/// A Hugging Face chat template: Jinja source parsed once, rendered like transformers'
/// `tokenizer.apply_chat_template(messages, tokenize=False, ...)`, byte for byte.
///
/// The interpreter covers what chat templates use: `for` (with `loop.*`, `else`, filters, `break`/`continue`), `if`,
/// `set` (with `namespace()`), `macro`/`call`, `filter` blocks, `{% generation %}`, raw blocks and comments; Python
/// values with their truthiness, arithmetic and printing; jinja2's filters and tests and Python's string and dict
/// methods; and whitespace control as transformers configures jinja2 (`trim_blocks`, `lstrip_blocks`).
public struct ChatTemplate: Sendable {
    /// The template text.
    public let source: String
    /// Named in errors.
    public let file: String
    /// Variables every rendering gets unless its own `extraContext` sets them (llama-server's and llama-cli's
    /// `--chat-template-kwargs`, such as Qwen 3's `enable_thinking`).
    public private(set) var defaultContext: [String: JSONValue] = [:]
    private let nodes: [TemplateNode]
    private let scalars: [Unicode.Scalar]

    /// Parses `source`; a syntax error names `file` and the line and column.
    public init(source: String, file: String = "chat_template") throws(ChatTemplateError) {
        self.source = source
        self.file = file
        scalars = TemplateLexer.normalize(source)
        var lexer = TemplateLexer(source: scalars, file: file)
        let tokens = try lexer.tokenize()
        var parser = TemplateParser(tokens: tokens, lexer: lexer)
        nodes = try parser.parseTemplate()
    }

    /// The same template with `variables` as its ``defaultContext`` (over the ones it had, key by key).
    public func withDefaultContext(_ variables: [String: JSONValue]) -> ChatTemplate {
        var template = self
        template.defaultContext.merge(variables) { $1 }
        return template
    }

    /// Renders a conversation as `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt: addGenerationPrompt, **extraContext)` does.
    ///
    /// As transformers does, message keys whose value is null are dropped, `tools` and `documents` are none unless
    /// `extraContext` sets them, and the reasoning text of a message is also given as `thinking` and
    /// `reasoning_content`.
    /// - Parameters:
    ///   - messages: objects with "role" and "content" (a string, or a list of `{"type": "text"|"image", …}` parts).
    ///   - bosToken: the `bos_token` variable; left undefined when nil.
    ///   - eosToken: the `eos_token` variable; left undefined when nil.
    ///   - extraContext: more variables (other special tokens, `tools`, `date_string`, …); they override the above.
    ///   - continueFinalMessage: `continue_final_message=True`: the text ends where the last message's text does, so
    ///     that the model continues that message (a reply "prefilled"); not with `addGenerationPrompt`.
    public func render(messages: [JSONValue], addGenerationPrompt: Bool = false, bosToken: String? = nil,
                       eosToken: String? = nil, extraContext: [String: JSONValue] = [:],
                       continueFinalMessage: Bool = false) throws(ChatTemplateError) -> String
    {
        try render(messages: messages, addGenerationPrompt: addGenerationPrompt, bosToken: bosToken, eosToken: eosToken,
                   extraContext: extraContext, now: nil, continueFinalMessage: continueFinalMessage)
    }

    /// ``render(messages:addGenerationPrompt:bosToken:eosToken:extraContext:)`` with where the template's
    /// `{% generation %}` blocks put their text, from which transformers' `apply_chat_template(...,
    /// return_assistant_tokens_mask=True)` marks the assistant's tokens (``Encoding/mask(covering:)``).
    public func renderMarkingGenerations(messages: [JSONValue], addGenerationPrompt: Bool = false, bosToken: String? = nil,
                                         eosToken: String? = nil, extraContext: [String: JSONValue] = [:])
        throws(ChatTemplateError) -> RenderedChat
    {
        try renderedChat(messages: messages, addGenerationPrompt: addGenerationPrompt, bosToken: bosToken,
                         eosToken: eosToken, extraContext: extraContext, now: nil)
    }

    /// `render` with `strftime_now` formatting `now` instead of the time of the call, so that templates printing
    /// today's date render reproducibly in tests.
    func render(messages: [JSONValue], addGenerationPrompt: Bool, bosToken: String?, eosToken: String?,
                extraContext: [String: JSONValue], now: Date?, continueFinalMessage: Bool = false) throws(ChatTemplateError) -> String
    {
        guard continueFinalMessage else {
            return try renderedChat(messages: messages, addGenerationPrompt: addGenerationPrompt, bosToken: bosToken,
                                    eosToken: eosToken, extraContext: extraContext, now: now).text
        }
        if addGenerationPrompt {
            throw .cannotContinue(file: file, message: "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead.")
        }
        let (tagged, final) = try taggingFinalMessage(messages)
        let rendered = try renderedChat(messages: tagged, addGenerationPrompt: false, bosToken: bosToken, eosToken: eosToken,
                                        extraContext: extraContext, now: now).text
        return try cutAtFinalMessage(rendered, final: final)
    }

    /// transformers' marker of where the final message's text ends, for `continue_final_message`.
    private static let continuationTag = Array("CONTINUE_FINAL_MESSAGE_TAG ".unicodeScalars)

    /// The conversation with the marker after the last message's text (its content, or the last text part of it),
    /// and that text, as `render_jinja_template` marks it.
    private func taggingFinalMessage(_ messages: [JSONValue]) throws(ChatTemplateError) -> ([JSONValue], String) {
        guard case let .object(pairs)? = messages.last else {
            throw .cannotContinue(file: file, message: "continue_final_message is set but the conversation is empty!")
        }
        var fields = pairs.filter { $0.1 != .null }
        guard let at = fields.lastIndex(where: { $0.0 == "content" }) else {
            throw .cannotContinue(file: file, message: #"continue_final_message is set but the final message has no "content" to continue!"#)
        }
        guard source.contains("content") else {
            throw .cannotContinue(file: file, message: #"continue_final_message is set to "content" but this is not an accepted field in the chat_template"#)
        }
        let tag = String(String.UnicodeScalarView(Self.continuationTag))
        let final: String
        switch fields[at].1 {
        case let .string(text):
            final = text
            fields[at].1 = .string(text + tag)
        case var .array(parts):
            guard let part = parts.lastIndex(where: { if case .object = $0 { $0["text"] != nil } else { false } }),
                  case var .object(partFields) = parts[part], let textAt = partFields.lastIndex(where: { $0.0 == "text" }),
                  case let .string(text) = partFields[textAt].1 else {
                throw .cannotContinue(file: file, message: "continue_final_message is set but we could not find any text to continue in the final message!")
            }
            final = text
            partFields[textAt].1 = .string(text + tag)
            parts[part] = .object(partFields)
            fields[at].1 = .array(parts)
        default:
            throw .cannotContinue(file: file, message: "continue_final_message is set but the final message's content is not text")
        }
        return (messages.dropLast() + [.object(fields)], final)
    }

    /// The rendering cut where the marker is (and the whitespace before it, when the template trimmed the text).
    private func cutAtFinalMessage(_ rendered: String, final: String) throws(ChatTemplateError) -> String {
        let text = Array(rendered.unicodeScalars)
        let tagWord = Array(Self.continuationTag.dropLast())
        let stripped = Array(PythonStrings.strip(final, nil, leading: true, trailing: true).unicodeScalars)
        guard Self.lastIndex(of: stripped, in: text) != nil, let at = Self.lastIndex(of: tagWord, in: text) else {
            throw .cannotContinue(file: file, message: "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.")
        }
        let before = String(String.UnicodeScalarView(text[..<at]))
        if text[at...].starts(with: Self.continuationTag) { return before }
        return PythonStrings.strip(before, nil, leading: false, trailing: true)
    }

    /// Python's `str.rindex` over code points (nil where it raises).
    private static func lastIndex(of needle: [Unicode.Scalar], in text: [Unicode.Scalar]) -> Int? {
        guard needle.count <= text.count else { return nil }
        return stride(from: text.count - needle.count, through: 0, by: -1).first { start in
            text[start..<start + needle.count].elementsEqual(needle)
        }
    }

    private func renderedChat(messages: [JSONValue], addGenerationPrompt: Bool, bosToken: String?, eosToken: String?,
                              extraContext: [String: JSONValue], now: Date?) throws(ChatTemplateError) -> RenderedChat
    {
        let globals = Scope(parent: nil)
        globals.variables = Interpreter.globals(file: file, now: now)
        let context = Scope(parent: globals)
        context.variables["messages"] = .list(messages.map { Value(Self.prepare($0)) })
        context.variables["tools"] = Value.none
        context.variables["documents"] = Value.none
        context.variables["add_generation_prompt"] = .bool(addGenerationPrompt)
        if let bosToken { context.variables["bos_token"] = .string(bosToken) }
        if let eosToken { context.variables["eos_token"] = .string(eosToken) }
        for (name, value) in defaultContext.merging(extraContext, uniquingKeysWith: { $1 }) {
            context.variables[name] = Value(value)
        }
        return try run(in: context)
    }

    /// Renders the template with the variables of `scope`, then empties what the render made that could keep itself
    /// alive (``RenderReferences``).
    func run(in scope: Scope) throws(ChatTemplateError) -> RenderedChat {
        var interpreter = Interpreter(file: file, lexer: TemplateLexer(source: scalars, file: file))
        defer { interpreter.references.release() }
        var output = ""
        _ = try interpreter.render(nodes, in: scope, into: &output)
        return RenderedChat(text: output, generations: interpreter.generations)
    }

    /// transformers drops a message's null fields and aliases its reasoning fields before rendering.
    private static func prepare(_ message: JSONValue) -> JSONValue {
        guard case let .object(pairs) = message else { return message }
        var fields = pairs.filter { $0.1 != .null }
        let reasoningNames = ["reasoning_content", "thinking", "reasoning"]
        guard let reasoning = reasoningNames.lazy.compactMap({ name in fields.first { $0.0 == name }?.1 }).first else {
            return .object(fields)
        }
        // Python: {"thinking": reasoning, **message, "reasoning_content": reasoning}
        if !fields.contains(where: { $0.0 == "thinking" }) { fields.insert(("thinking", reasoning), at: 0) }
        if let index = fields.firstIndex(where: { $0.0 == "reasoning_content" }) {
            fields[index].1 = reasoning
        } else {
            fields.append(("reasoning_content", reasoning))
        }
        return .object(fields)
    }

    /// Finds a checkpoint's default chat template the way transformers does: `chat_template.jinja`, then
    /// `chat_template.json` (`{"chat_template": …}`), then `tokenizer_config.json`'s "chat_template" — a string, or a
    /// list of `{"name", "template"}` of which the one named "default" is used.
    ///
    /// - Returns: nil if the directory holds no chat template.
    public static func load(directory: URL) throws(ChatTemplateError) -> ChatTemplate? {
        let jinja = directory.appendingPathComponent("chat_template.jinja")
        if FileManager.default.fileExists(atPath: jinja.path) { return try jinjaFile(jinja) }
        for name in ["chat_template.json", "tokenizer_config.json"] {
            let url = directory.appendingPathComponent(name)
            guard FileManager.default.fileExists(atPath: url.path) else { continue }
            if let template = try jsonFile(url, requiringTemplate: name == "chat_template.json") { return template }
        }
        return nil
    }

    /// A chat template given as a file, as llama-server's `--chat-template-file` and vLLM's `--chat-template` take
    /// one: Jinja text, or (a `.json` file) JSON holding a "chat_template", as chat_template.json and
    /// tokenizer_config.json hold it.
    public static func load(file url: URL) throws(ChatTemplateError) -> ChatTemplate {
        guard url.pathExtension.lowercased() == "json" else { return try jinjaFile(url) }
        // A JSON file without a template is refused here: it was named to give one.
        return try jsonFile(url, requiringTemplate: true)!
    }

    private static func jinjaFile(_ url: URL) throws(ChatTemplateError) -> ChatTemplate {
        guard let text = String(data: try read(url), encoding: .utf8) else {
            throw .invalidTemplateFile(file: url.path, message: "not valid UTF-8")
        }
        return try ChatTemplate(source: text, file: url.path)
    }

    /// The "chat_template" of a JSON file: a string, or the one named "default" of a list of `{"name", "template"}`;
    /// nil when the file has none and none is required.
    private static func jsonFile(_ url: URL, requiringTemplate: Bool) throws(ChatTemplateError) -> ChatTemplate? {
        let json = try JSONValue(parsing: try read(url), file: url.path)
        guard case .object = json else { throw .invalidTemplateFile(file: url.path, message: "the top level is not an object") }
        switch json["chat_template"] {
        case nil, .null?:
            if requiringTemplate { throw .invalidTemplateFile(file: url.path, message: "no \"chat_template\" field") }
            return nil
        case let .string(text)?:
            return try ChatTemplate(source: text, file: url.path + ": chat_template")
        case let .array(entries)?:
            for entry in entries {
                guard case let .string(entryName)? = entry["name"], case let .string(text)? = entry["template"] else {
                    throw .invalidTemplateFile(file: url.path, message: "each \"chat_template\" entry needs a string \"name\" and \"template\"")
                }
                if entryName == "default" { return try ChatTemplate(source: text, file: url.path + ": chat_template[default]") }
            }
            throw .invalidTemplateFile(file: url.path, message: "\"chat_template\" lists no template named \"default\"")
        default:
            throw .invalidTemplateFile(file: url.path, message: "\"chat_template\" is neither a string nor a list of named templates")
        }
    }

    private static func read(_ url: URL) throws(ChatTemplateError) -> Data {
        do {
            return try Data(contentsOf: url)
        } catch {
            throw .unreadable(file: url.path, message: error.localizedDescription)
        }
    }
}
