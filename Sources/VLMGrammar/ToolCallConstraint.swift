import Foundation
import VLMModels
import VLMTemplates

/// Holds a reply's tool calls to the request's tools while leaving the rest of it free: llama.cpp's lazy grammars
/// (llama-server with `tool_choice: "auto"`), with the calls' places and shape taken from the model's response
/// template rather than from per-family code.
///
/// The reply is read by the template's own ``ResponseParser`` as it is generated. Outside a call region every token
/// is allowed. When the parser opens a `tool_calls` region, the rest of that region is held to a grammar: optional
/// whitespace, JSON of one of the tools' calls (its name and its parameters' schema, converted as llama.cpp
/// converts schemas; for a name the open delimiter captured, that tool's parameters), whitespace, the closing
/// delimiter. Then the reply is free again, or, with `parallelCalls` false, may only end. The parser is the same
/// one that later splits the reply into the message, so a call in the reasoning, or in a region the prompt began,
/// is treated as the message will treat it.
///
/// A region is constrained from where the parser commits its opening, which for a delimiter given as a pattern
/// is one piece of text after it (the parser holds a pattern's match back while more text could lengthen it);
/// text already generated in the region that the grammar does not read leaves that region free.
public final class ToolCallConstraint: GenerationConstraint {
    fileprivate let format: ToolCallFormat
    /// The parser after the prompt, copied for each sequence.
    private let parser: ResponseParser
    /// Each token's bytes as the parser reads them (special tokens' text included).
    private let tokenBytes: [[UInt8]]
    fileprivate let endTokens: Set<Int>
    fileprivate let callLimit: Int
    /// The grammar of a call region's rest, by ``ToolCallFormat/schemaKey(captures:)``.
    private let grammars: [String: GrammarConstraint]

    /// - Parameters:
    ///   - prompt: the prompt's text (special tokens included), which the parser reads first.
    ///   - tokenBytes: each token's bytes (`Tokenizer.tokenBytes(count:)`).
    ///   - grammarConstraint: a grammar's constraint over the same tokens, allowing no end token (the pipelines hand
    ///     out the ones they keep, so that requests with the same tools reuse the masks worked out before).
    /// - Returns: nil when the template's calls cannot be written as JSON between literal delimiters
    ///   (``ResponseTemplate/toolCallFormat(tools:)``).
    /// - Throws: `GrammarError` for a tool's parameters that are not a schema llama.cpp converts (as a forced call
    ///   of it would be refused); the template's errors parsing the prompt.
    public init?(template: ResponseTemplate, tools: [JSONValue], prompt: String, tokenBytes: [[UInt8]],
                 grammarConstraint: (Grammar) -> GrammarConstraint, endTokens: Set<Int>, parallelCalls: Bool = true) throws {
        guard let format = template.toolCallFormat(tools: tools) else { return nil }
        self.format = format
        var grammars: [String: GrammarConstraint] = [:]
        for (key, schema) in format.contentSchemas {
            let conversion = try JSONSchemaGrammar.convert(schema)
            // The converter's rules are `root` and names it derives from `root` or its built-ins; these two are new.
            let closing = format.close.map(Grammar.literal).joined(separator: " | ")
            let text = conversion.grammar
                + "tool-call-region ::= tool-call-space root tool-call-space (\(closing))\n"
                + #"tool-call-space ::= | " " | "\n"{1,2} [ \t]{0,20}"# + "\n"
            grammars[key] = grammarConstraint(try Grammar(gbnf: text, root: "tool-call-region"))
        }
        self.grammars = grammars
        parser = try ResponseParser(template: template, prefix: prompt, tools: tools)
        self.tokenBytes = tokenBytes
        self.endTokens = endTokens
        callLimit = parallelCalls ? .max : 1
    }

    public func start() -> any TokenConstraint {
        ToolCallTokenConstraint(self, parser: parser)
    }

    /// The grammar of a call region's rest for its captures, nil when it has none (a captured name no tool has).
    fileprivate func grammar(captures: [String: String]) -> GrammarConstraint? {
        format.schemaKey(captures: captures).flatMap { grammars[$0] }
    }

    fileprivate func bytes(_ token: Int) -> [UInt8] { token >= 0 && token < tokenBytes.count ? tokenBytes[token] : [] }
}

/// One sequence's progress: free text, a call region held to its grammar, a region left free, or (calls used up)
/// only the end.
final class ToolCallTokenConstraint: TokenConstraint {
    private enum Phase {
        case free
        case call(GrammarConstraint, GrammarState)
        /// In a call region whose text so far the grammar does not read.
        case unconstrainedCall
        case ended
    }

    private let owner: ToolCallConstraint
    private var parser: ResponseParser
    private var phase = Phase.free
    private var calls = 0
    /// The start of a UTF-8 sequence the last token cut short.
    private var pending: [UInt8] = []

    fileprivate init(_ owner: ToolCallConstraint, parser: ResponseParser) {
        self.owner = owner
        self.parser = parser
        // The prompt may have opened a call region itself.
        take(parser.initialEvents)
    }

    func allows(_ token: Int) -> Bool {
        switch phase {
        case .free, .unconstrainedCall: true
        case let .call(grammar, state): grammar.allows(token, after: state)
        case .ended: owner.endTokens.contains(token)
        }
    }

    func restrict(_ scores: inout [Float]) -> Bool {
        switch phase {
        case .free, .unconstrainedCall:
            return true
        case let .call(grammar, state):
            return grammar.restrict(&scores, after: state)
        case .ended:
            var any = false
            for index in scores.indices {
                if owner.endTokens.contains(index) { any = true } else { scores[index] = -.infinity }
            }
            return any
        }
    }

    func accept(_ token: Int) {
        if case let .call(grammar, state) = phase {
            let next = grammar.state(after: token, from: state)
            if grammar.grammar.isComplete(next) {
                calls += 1
                phase = calls >= owner.callLimit ? .ended : .free
            } else {
                phase = .call(grammar, next)
            }
        }
        guard let events = try? parser.feed(text(of: token)) else {
            // A delimiter's regex gave up on the text: the reply can no longer be followed, so it is left free.
            if case .ended = phase {} else { phase = .free }
            return
        }
        take(events)
    }

    private func take(_ events: [ResponseEvent]) {
        var opened = false
        var body = ""
        for event in events {
            switch event {
            case let .open(field) where field == owner.format.field:
                opened = true
                body = ""
            case let .chunk(field, text, _) where field == owner.format.field && opened:
                body += text
            case let .close(field, _) where field == owner.format.field, let .malformed(field, _) where field == owner.format.field:
                opened = false
                switch phase {
                case .call, .unconstrainedCall: phase = .free
                case .free, .ended: break
                }
            default:
                break
            }
        }
        if opened, case .free = phase { enterCall(body: body) }
    }

    /// A call region has opened, `body` of it already generated.
    private func enterCall(body: String) {
        guard let grammar = owner.grammar(captures: parser.openCaptures),
              let state = grammar.grammar.accept(bytes: Array(body.utf8), from: grammar.grammar.initialState) else {
            phase = .unconstrainedCall
            return
        }
        phase = .call(grammar, state)
    }

    /// The token's text for the parser; a UTF-8 sequence it cuts short waits for the next token.
    private func text(of token: Int) -> String {
        pending += owner.bytes(token)
        var whole = pending.count
        // Back up over an incomplete last sequence (at most three bytes of it).
        var index = pending.count - 1
        while index >= 0 && index >= pending.count - 3 && pending[index] & 0xC0 == 0x80 { index -= 1 }
        if index >= 0 {
            let lead = pending[index]
            let length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1
            if index + length > pending.count { whole = index }
        }
        let text = String(decoding: pending[..<whole], as: UTF8.self)
        pending.removeFirst(whole)
        return text
    }
}
