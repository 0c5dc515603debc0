import Foundation
import SwiftVLM

/// What a piece of a reply adds to the chat message a client sees, once the model's response template has split
/// it: text of the answer, text of the reasoning, and tool calls (each whole, once its region has closed).
struct ReplyDelta {
    var content = ""
    var reasoning = ""
    var toolCalls: [JSONValue] = []
}

/// One choice's reply parsed with the model's response template as it is generated, as transformers serve parses
/// it: the prompt (with its special tokens) read first, so that a reply the template began is parsed in the right
/// region. Streamed, the text of `content` regions goes out as content and the reasoning fields' as
/// `reasoning_content`, as it arrives (unstripped, as transformers serve streams region chunks), and each closed
/// `tool_calls` region as a call; whole, the message is the parsed values. A region that does not parse is dropped
/// and parsing goes on (a tool call that is not JSON is not a call; vLLM drops it too).
struct ReplyParser {
    /// transformers' reasoning fields (`_REASONING_FIELDS`): templates should say `reasoning_content`; some say
    /// `thinking` or `reasoning`.
    private static let reasoningFields = ["reasoning_content", "thinking", "reasoning"]

    private var parser: ResponseParser
    /// The calls kept: one when the request says `parallel_tool_calls: false` (the first, as vLLM keeps it).
    private let callLimit: Int
    private(set) var callCount = 0

    init(template: ResponseTemplate, prompt: String, tools: [JSONValue]?, parallelToolCalls: Bool = true) throws {
        callLimit = parallelToolCalls ? .max : 1
        do { parser = try ResponseParser(template: template, prefix: prompt, tools: tools) } catch {
            throw APIError.invalid("\(error)", param: "messages")
        }
    }

    /// What the reply's next text adds to a stream.
    mutating func take(_ text: String) throws -> ReplyDelta {
        let events: [ResponseEvent]
        do { events = try parser.feed(text) } catch { throw Self.failure(error) }
        return delta(events)
    }

    /// The reply's last text and its end: what the stream still gets (that text, what was held back, the open
    /// region closed), and the whole message as transformers serve answers it unstreamed: the parsed content ("" when
    /// none), reasoning and calls.
    mutating func finish(_ text: String) throws -> (last: ReplyDelta, message: ReplyDelta) {
        var last = try take(text)
        let message: JSONValue, events: [ResponseEvent]
        do { (message, events) = try parser.finalize() } catch { throw Self.failure(error) }
        let closing = delta(events)
        last.content += closing.content
        last.reasoning += closing.reasoning
        last.toolCalls += closing.toolCalls
        var whole = ReplyDelta()
        if case let .string(content)? = message["content"] { whole.content = content }
        for field in Self.reasoningFields {
            if case let .string(reasoning)? = message[field] {
                whole.reasoning = reasoning
                break
            }
        }
        if case let .array(calls)? = message["tool_calls"] { whole.toolCalls = Array(calls.flatMap(Self.calls).prefix(callLimit)) }
        return (last, whole)
    }

    /// A template that cannot finish parsing (a regex that gives up on the text) is the server's problem, not the
    /// client's request: reported as such.
    private static func failure(_ error: any Error) -> APIError {
        APIError.internalError("the reply could not be parsed with the model's response template: \(error)")
    }

    private mutating func delta(_ events: [ResponseEvent]) -> ReplyDelta {
        var delta = ReplyDelta()
        for event in events {
            switch event {
            case let .chunk(field, text, dirty) where !dirty:
                if field == "content" { delta.content += text } else if Self.reasoningFields.contains(field) { delta.reasoning += text }
            case let .close(field, value) where field == "tool_calls":
                for call in Self.calls(in: value) where callCount < callLimit {
                    delta.toolCalls.append(call)
                    callCount += 1
                }
            default:
                break
            }
        }
        return delta
    }

    /// A closed `tool_calls` region's calls (`{"type": "function", "function": {"name", "arguments"}}`, or a list
    /// of them) as OpenAI's `tool_calls` entries, arguments as JSON text (Python's `json.dumps`, as transformers
    /// serve writes them).
    private static func calls(in value: JSONValue) -> [JSONValue] {
        if case let .array(items) = value { return items.flatMap(calls) }
        guard case let .string(name)? = value["function"]?["name"], let arguments = value["function"]?["arguments"] else { return [] }
        let text: String
        if case let .string(raw) = arguments { text = raw } else { text = arguments.pythonJSONText() }
        return [ToolRequest.call(name: name, arguments: text)]
    }
}
