/// markupsafe's `Markup`, which `|safe`, `|escape` and `|forceescape` make. transformers' environment does not
/// autoescape, so printing never escapes anything; but Markup's own operators and methods HTML-escape their plain-string
/// operands, and templates that write `"…"|safe + text` see `text` escaped. `~` and the `join` filter build plain
/// strings without escaping, as jinja2's `str_join` and non-autoescaping `do_join` do.
extension Value {
    /// `text` as the same kind of string as this value: Markup stays Markup, as its slices and methods return Markup.
    func sameStringKind(_ text: String) -> Value {
        if case .markup = self { return .markup(text) }
        return .string(text)
    }

    /// markupsafe's `escape()`: Markup unchanged, anything else its `str()` with `& < > ' "` replaced by entities.
    var markupEscaped: String {
        if case let .markup(text) = self { return text }
        return PythonStrings.htmlEscape(pythonString)
    }
}

extension Interpreter {
    /// The result of a binary operator with a Markup operand, or nil when neither operand is Markup.
    func markupOperation(_ op: String, _ left: Value, _ right: Value) throws(ChatTemplateError) -> Value? {
        switch (op, left, right) {
        case let ("+", .markup(text), _) where right.stringContent != nil:
            return .markup(try concatenated(text, right.markupEscaped))
        case let ("+", .string, .markup(markup)):
            return .markup(try concatenated(left.markupEscaped, markup))
        case ("+", .markup, _), ("+", _, .markup):
            throw error("unsupported operand type(s) for +: '\(left.typeName)' and '\(right.typeName)'")
        case let ("*", .markup(text), _):
            return try binary("*", .string(text), right).stringContent.map(Value.markup)
        case let ("*", _, .markup(text)):
            return try binary("*", left, .string(text)).stringContent.map(Value.markup)
        case ("%", .markup, _):
            throw error("printf-style string formatting with '%' is not supported")
        default:
            return nil
        }
    }

    /// A bound method of a Markup string: the str method, with the arguments markupsafe escapes escaped and its string
    /// results Markup, as markupsafe's overrides make them.
    func markupMethod(_ name: String, _ content: String) -> Value? {
        guard case let .callable(method)? = stringMethod(name, content) else { return nil }
        return .callable(Callable(name: name) { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            var arguments = arguments
            switch name {
            case "format":
                arguments.positional = arguments.positional.map { .markup($0.markupEscaped) }
                arguments.keyword = arguments.keyword.map { ($0.0, .markup($0.1.markupEscaped)) }
            case "join":
                if let iterable = arguments.positional.first {
                    arguments.positional[0] = .list(try interpreter.iterate(iterable).map { .markup($0.markupEscaped) })
                }
            case "replace":
                if arguments.positional.count > 1 { arguments.positional[1] = .markup(arguments.positional[1].markupEscaped) }
            default:
                break
            }
            // Every str method this interpreter knows that returns strings is one markupsafe wraps to return Markup.
            switch try method.call(&interpreter, arguments) {
            case let .string(text): return .markup(text)
            case let .list(values): return .list(values.map { $0.stringContent.map(Value.markup) ?? $0 })
            case let result: return result
            }
        })
    }
}
