import Foundation

/// jinja2's filters and tests, Python's `str`/`dict`/`list` methods, and the globals transformers provides.
extension Interpreter {
    // MARK: Argument helpers

    private func string(_ value: Value?, _ what: String) throws(ChatTemplateError) -> String? {
        guard let value else { return nil }
        switch value {
        case .none: return nil
        case let .string(text), let .markup(text): return text
        default: throw error("\(what) must be a string, not '\(value.typeName)'")
        }
    }

    private func int(_ value: Value?, _ what: String) throws(ChatTemplateError) -> Int? {
        guard let value else { return nil }
        if case .none = value { return nil }
        guard let integer = value.integer else { throw error("\(what) must be an integer, not '\(value.typeName)'") }
        return integer
    }

    private func rejectExtra(_ arguments: CallArguments, _ name: String, positional: Int) throws(ChatTemplateError) {
        if arguments.positional.count > positional {
            throw error("\(name)() takes at most \(positional) positional arguments (\(arguments.positional.count) given)")
        }
        if let (extra, _) = arguments.keyword.first {
            throw error("\(name)() got an unexpected keyword argument '\(extra)'")
        }
    }

    /// Python `str()` of a value, failing for Undefined where jinja2 would.
    private func text(_ value: Value) -> String { value.pythonString }

    /// A dotted attribute path such as "function.name", looked up like jinja2's `make_attrgetter`.
    private mutating func attributePath(_ path: String, of value: Value) throws(ChatTemplateError) -> Value {
        var result = value
        for part in path.split(separator: ".", omittingEmptySubsequences: false) {
            let key: Value = Int(part).map { .int($0) } ?? .string(String(part))
            result = try item(key, of: result)
        }
        return result
    }

    private func lowered(_ value: Value, caseSensitive: Bool) -> Value {
        if !caseSensitive, let text = value.stringContent { return .string(PythonStrings.lower(text)) }
        return value
    }

    private func sortedValues(_ values: [Value], reverse: Bool, key: (Value) throws(ChatTemplateError) -> Value)
        throws(ChatTemplateError) -> [Value]
    {
        var keyed: [(Value, Value)] = []
        for value in values { keyed.append((try key(value), value)) }
        var failure: ChatTemplateError?
        // A stable sort, as Python's; reversing keeps equal items in order, as Python's reverse=True does.
        let indexed = keyed.enumerated().map { ($0.offset, $0.element) }
        let sorted = indexed.sorted { a, b in
            guard let ordering = order(a.1.0, b.1.0) else {
                failure = failure ?? error("'<' not supported between instances of '\(a.1.0.typeName)' and '\(b.1.0.typeName)'")
                return a.0 < b.0
            }
            if ordering == 0 { return a.0 < b.0 }
            return reverse ? ordering > 0 : ordering < 0
        }
        if let failure { throw failure }
        return sorted.map(\.1.1)
    }

    /// What `map` does to each item, from its arguments: jinja2's `prepare_map`.
    private func mapping(_ arguments: CallArguments) throws(ChatTemplateError)
        -> (inout Interpreter, Value) throws(ChatTemplateError) -> Value
    {
        var arguments = arguments
        if let attributeName = try string(arguments.take(-1, "attribute"), "attribute") {
            let fallback = arguments.take(-1, "default")
            try rejectExtra(arguments, "map", positional: 0)
            return { (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
                let result = try interpreter.attributePath(attributeName, of: item)
                return result.isUndefined ? fallback ?? result : result
            }
        }
        guard let filterName = try string(arguments.positional.first, "filter name") else {
            throw error("map requires a filter argument")
        }
        guard Self.filterNames.contains(filterName) else { throw error("No filter named '\(filterName)'.") }
        arguments.positional.removeFirst()
        return { [arguments] (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
            try interpreter.applyFilter(filterName, to: item, arguments)
        }
    }

    /// Whether `select`, `reject`, `selectattr` or `rejectattr` keeps an item, from its arguments: jinja2's
    /// `prepare_select_or_reject`.
    private func selection(_ filterName: String, _ arguments: CallArguments) throws(ChatTemplateError)
        -> (inout Interpreter, Value) throws(ChatTemplateError) -> Bool
    {
        var rest = arguments
        var attributeName: String?
        if filterName.hasSuffix("attr") {
            guard !rest.positional.isEmpty, let name = try string(rest.positional.removeFirst(), "attribute") else {
                throw error("\(filterName) requires an attribute name")
            }
            attributeName = name
        }
        let testName = rest.positional.isEmpty ? nil : try string(rest.positional.removeFirst(), "test name")
        let keeps = filterName.hasPrefix("select")
        return { [rest, attributeName] (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
            let subject = try attributeName.map { (path) throws(ChatTemplateError) in try interpreter.attributePath(path, of: item) } ?? item
            let passes = try testName.map { (test) throws(ChatTemplateError) in try interpreter.applyTest(test, to: subject, rest) }
                ?? subject.isTruthy
            return passes == keeps
        }
    }

    // MARK: Filters

    mutating func applyFilter(_ name: String, to value: Value, _ arguments: CallArguments) throws(ChatTemplateError) -> Value {
        var arguments = arguments
        switch name {
        case "abs":
            switch value {
            case let .int(number):
                guard number != .min else { throw error("integer overflow") }
                return .int(abs(number))
            case let .bool(flag): return .int(flag ? 1 : 0)
            case let .double(number): return .double(abs(number))
            default: throw error("bad operand type for abs(): '\(value.typeName)'")
            }
        case "attr":
            guard let attributeName = try string(arguments.take(0, "name"), "attr name") else {
                throw error("attr() needs an attribute name")
            }
            return try attribute(attributeName, of: value)
        case "capitalize":
            return value.sameStringKind(PythonStrings.capitalize(text(value)))
        case "center":
            let width = try int(arguments.take(0, "width"), "width") ?? 80
            let content = text(value)
            let length = content.unicodeScalars.count
            guard width > length else { return value.sameStringKind(content) }
            // Python's str.center puts the extra space on the right unless the padding and width are both odd.
            let padding = width - length
            let left = padding / 2 + (padding & width & 1)
            return value.sameStringKind(String(repeating: " ", count: left) + content + String(repeating: " ", count: padding - left))
        case "count", "length":
            switch value {
            case .undefined: return .int(0)
            case let .string(content), let .markup(content): return .int(content.unicodeScalars.count)
            case let .list(values), let .tuple(values): return .int(values.count)
            case let .dict(pairs): return .int(pairs.count)
            case let .namespace(namespace): return .int(namespace.attributes.count)
            default: throw error("object of type '\(value.typeName)' has no len()")
            }
        case "d", "default":
            let fallback = arguments.take(0, "default_value") ?? .string("")
            let boolean = arguments.take(1, "boolean")?.isTruthy ?? false
            if value.isUndefined || (boolean && !value.isTruthy) { return fallback }
            return value
        case "dictsort":
            guard case let .dict(pairs) = value else { throw error("dictsort expects a mapping, got '\(value.typeName)'") }
            let caseSensitive = arguments.take(0, "case_sensitive")?.isTruthy ?? false
            let by = try string(arguments.take(1, "by"), "by") ?? "key"
            let reverse = arguments.take(2, "reverse")?.isTruthy ?? false
            guard by == "key" || by == "value" else { throw error("You can only sort by either 'key' or 'value'") }
            let tuples = pairs.map { Value.tuple([$0.0, $0.1]) }
            return .list(try sortedValues(tuples, reverse: reverse) { (item: Value) throws(ChatTemplateError) in
                guard case let .tuple(pair) = item else { return item }
                return lowered(by == "key" ? pair[0] : pair[1], caseSensitive: caseSensitive)
            })
        case "e", "escape":
            return .markup(value.markupEscaped)
        case "forceescape":
            return .markup(PythonStrings.htmlEscape(text(value)))
        case "first":
            // Python's next(iter(value)): a generator gives up only its first item.
            var items = try cursor(over: value)
            return try items.next(&self) ?? .undefined("No first item, sequence was empty.")
        case "last":
            if case .generator = value { throw error("'generator' object is not reversible") }
            let items = try iterate(value)
            return items.last ?? .undefined("No last item, sequence was empty.")
        case "float":
            let fallback = arguments.take(0, "default") ?? .double(0)
            switch value {
            case let .double(number): return .double(number)
            case let .int(number): return .double(Double(number))
            case let .bool(flag): return .double(flag ? 1 : 0)
            case let .string(content), let .markup(content):
                return Double(PythonStrings.strip(content, nil, leading: true, trailing: true).replacingOccurrences(of: "_", with: "")).map { .double($0) } ?? fallback
            default: return fallback
            }
        case "int":
            let fallback = arguments.take(0, "default") ?? .int(0)
            let base = try int(arguments.take(1, "base"), "base") ?? 10
            switch value {
            case let .int(number): return .int(number)
            case let .bool(flag): return .int(flag ? 1 : 0)
            case let .double(number):
                guard number.isFinite, abs(number) < 9.2e18 else { return fallback }
                return .int(Int(number))
            case let .string(content), let .markup(content):
                let trimmed = PythonStrings.strip(content, nil, leading: true, trailing: true).replacingOccurrences(of: "_", with: "")
                if let number = Int(trimmed, radix: base) { return .int(number) }
                if let number = Double(trimmed), number.isFinite, abs(number) < 9.2e18 { return .int(Int(number)) }
                return fallback
            default: return fallback
            }
        case "indent":
            let widthValue = arguments.take(0, "width") ?? .int(4)
            let first = arguments.take(1, "first")?.isTruthy ?? false
            let blank = arguments.take(2, "blank")?.isTruthy ?? false
            let indentation: String
            if case let .string(custom) = widthValue {
                indentation = custom
            } else {
                indentation = String(repeating: " ", count: max(0, try int(widthValue, "width") ?? 4))
            }
            let lines = PythonStrings.splitlines(text(value) + "\n")
            var result: String
            if blank {
                result = lines.joined(separator: "\n" + indentation)
            } else {
                result = lines.first ?? ""
                let rest = lines.dropFirst()
                if !rest.isEmpty {
                    result += "\n" + rest.map { $0.isEmpty ? $0 : indentation + $0 }.joined(separator: "\n")
                }
            }
            return value.sameStringKind(first ? indentation + result : result)
        case "items":
            return makeGenerator("do_items", body: { (interpreter: inout Interpreter) throws(ChatTemplateError) in
                switch value {
                case .undefined: return nil
                case let .dict(pairs): return .list(pairs.map { .tuple([$0.0, $0.1]) })
                default: throw interpreter.error("Can only get item pairs from a mapping.")
                }
            }, transform: { _, item in item })
        case "join":
            let separator = try string(arguments.take(0, "d"), "separator") ?? ""
            let attributeName = try string(arguments.take(1, "attribute"), "attribute")
            var items = try iterate(value)
            if let attributeName {
                var mapped: [Value] = []
                for item in items { mapped.append(try attributePath(attributeName, of: item)) }
                items = mapped
            }
            let joined = items.map(text).joined(separator: separator)
            guard joined.utf8.count <= Self.maximumBuiltSize else { throw error("joined string too large") }
            return .string(joined)
        case "list":
            return .list(try iterate(value))
        case "lower":
            return value.sameStringKind(PythonStrings.lower(text(value)))
        case "upper":
            return value.sameStringKind(PythonStrings.upper(text(value)))
        case "title":
            return .string(PythonStrings.jinjaTitle(text(value)))
        case "map":
            // jinja2's map, select, reject, selectattr and rejectattr are generators beginning with `if value:`, so
            // a falsy value (none, undefined, 0, "") yields nothing where iterating it would fail, and their
            // arguments are checked only once something iterates them.
            var transform: ((inout Interpreter, Value) throws(ChatTemplateError) -> Value)?
            return makeGenerator("sync_do_map", body: { (interpreter: inout Interpreter) throws(ChatTemplateError) in
                guard value.isTruthy else { return nil }
                transform = try interpreter.mapping(arguments)
                return value
            }, transform: { (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
                try transform!(&interpreter, item)
            })
        case "max", "min":
            let caseSensitive = arguments.take(0, "case_sensitive")?.isTruthy ?? false
            let attributeName = try string(arguments.take(1, "attribute"), "attribute")
            let items = try iterate(value)
            guard !items.isEmpty else { return .undefined("No aggregated item, sequence was empty.") }
            let sorted = try sortedValues(items, reverse: name == "max") { (item: Value) throws(ChatTemplateError) in
                lowered(try attributeName.map { (path) throws(ChatTemplateError) in try attributePath(path, of: item) } ?? item,
                        caseSensitive: caseSensitive)
            }
            return sorted[0]
        case "reject", "select", "rejectattr", "selectattr":
            var passes: ((inout Interpreter, Value) throws(ChatTemplateError) -> Bool)?
            return makeGenerator("select_or_reject", body: { (interpreter: inout Interpreter) throws(ChatTemplateError) in
                guard value.isTruthy else { return nil }
                passes = try interpreter.selection(name, arguments)
                return value
            }, transform: { (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
                try passes!(&interpreter, item) ? item : nil
            })
        case "replace":
            guard let old = try string(arguments.take(0, "old"), "old"), let new = try string(arguments.take(1, "new"), "new") else {
                throw error("replace() needs the old and new strings")
            }
            let count = try int(arguments.take(2, "count"), "count") ?? -1
            let result = PythonStrings.replace(text(value), old, new, count: count)
            guard result.utf8.count <= Self.maximumBuiltSize else { throw error("replaced string too large") }
            return .string(result)
        case "reverse":
            if let content = value.stringContent {
                return value.sameStringKind(String(String.UnicodeScalarView(content.unicodeScalars.reversed())))
            }
            return .list(try iterate(value).reversed())
        case "round":
            let precision = try int(arguments.take(0, "precision"), "precision") ?? 0
            let method = try string(arguments.take(1, "method"), "method") ?? "common"
            guard let number = value.number else { throw error("round expects a number, got '\(value.typeName)'") }
            guard (0...30).contains(precision) else { throw error("round precision must be between 0 and 30") }
            switch method {
            case "common":
                guard number.isFinite else { return .double(number) }
                // printf's correctly rounded conversion is what Python's round() computes.
                return .double(Double(String(format: "%.\(precision)f", number))!)
            case "ceil", "floor":
                let scale = pow(10, Double(precision))
                let scaled = number * scale
                return .double((method == "ceil" ? scaled.rounded(.up) : scaled.rounded(.down)) / scale)
            default:
                throw error("method must be common, ceil or floor")
            }
        case "safe":
            return .markup(text(value))
        case "sort":
            let reverse = arguments.take(0, "reverse")?.isTruthy ?? false
            let caseSensitive = arguments.take(1, "case_sensitive")?.isTruthy ?? false
            let attributeName = try string(arguments.take(2, "attribute"), "attribute")
            return .list(try sortedValues(try iterate(value), reverse: reverse) { (item: Value) throws(ChatTemplateError) in
                lowered(try attributeName.map { (path) throws(ChatTemplateError) in try attributePath(path, of: item) } ?? item,
                        caseSensitive: caseSensitive)
            })
        case "string":
            // jinja2's soft_str: Markup stays Markup.
            return value.sameStringKind(text(value))
        case "sum":
            let attributeName = try string(arguments.take(0, "attribute"), "attribute")
            var total = arguments.take(1, "start") ?? .int(0)
            for item in try iterate(value) {
                let addend = try attributeName.map { (path) throws(ChatTemplateError) in try attributePath(path, of: item) } ?? item
                total = try binary("+", total, addend)
            }
            return total
        case "tojson":
            let ensureASCII = arguments.take(0, "ensure_ascii")?.isTruthy ?? false
            let indentValue = arguments.take(1, "indent") ?? .none
            let separatorsValue = arguments.take(2, "separators") ?? .none
            let sortKeys = arguments.take(3, "sort_keys")?.isTruthy ?? false
            var indent: String?
            switch indentValue {
            case .none: indent = nil
            case let .string(custom): indent = custom
            default: indent = String(repeating: " ", count: max(0, try int(indentValue, "indent") ?? 0))
            }
            var separators: (String, String)?
            switch separatorsValue {
            case .none: separators = nil
            case let .list(pair), let .tuple(pair):
                guard pair.count == 2, case let .string(item) = pair[0], case let .string(key) = pair[1] else {
                    throw error("separators must be a pair of strings")
                }
                separators = (item, key)
            default: throw error("separators must be a pair of strings")
            }
            let encoder = PythonJSONEncoder(ensureASCII: ensureASCII, indent: indent, separators: separators, sortKeys: sortKeys)
            do {
                return .string(try encoder.encode(value))
            } catch .notSerializable(let type) {
                throw error("Object of type \(type == "Undefined" ? "Undefined" : type) is not JSON serializable")
            } catch {
                throw self.error("value nested too deeply for tojson")
            }
        case "trim":
            let characters = try string(arguments.take(0, "chars"), "chars")
            return value.sameStringKind(PythonStrings.strip(text(value), characters, leading: true, trailing: true))
        case "truncate":
            let length = try int(arguments.take(0, "length"), "length") ?? 255
            let killWords = arguments.take(1, "killwords")?.isTruthy ?? false
            let end = try string(arguments.take(2, "end"), "end") ?? "..."
            let leeway = try int(arguments.take(3, "leeway"), "leeway") ?? 5
            let scalars = Array(text(value).unicodeScalars)
            if scalars.count <= length + leeway { return .string(text(value)) }
            let cut = max(0, length - end.unicodeScalars.count)
            var kept = String(String.UnicodeScalarView(scalars[..<min(cut, scalars.count)]))
            if !killWords, let space = kept.unicodeScalars.lastIndex(of: " ") {
                kept = String(kept.unicodeScalars[..<space])
            }
            return .string(kept + end)
        case "unique":
            var key: ((inout Interpreter, Value) throws(ChatTemplateError) -> Value)?
            var seen: [Value] = []
            return makeGenerator("sync_do_unique", body: { (interpreter: inout Interpreter) throws(ChatTemplateError) in
                var arguments = arguments
                let caseSensitive = arguments.take(0, "case_sensitive")?.isTruthy ?? false
                let attributeName = try interpreter.string(arguments.take(1, "attribute"), "attribute")
                key = { (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
                    interpreter.lowered(
                        try attributeName.map { (path) throws(ChatTemplateError) in try interpreter.attributePath(path, of: item) } ?? item,
                        caseSensitive: caseSensitive)
                }
                return value
            }, transform: { (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
                let itemKey = try key!(&interpreter, item)
                guard !seen.contains(where: { $0.pythonEquals(itemKey) }) else { return nil }
                seen.append(itemKey)
                return item
            })
        case "wordcount":
            return .int(PythonStrings.split(text(value), nil, maxSplit: -1).count)
        case "batch":
            var source: ValueCursor?
            var size = 0
            var fill: Value?
            var pending: [Value] = []
            return .generator(TemplateGenerator(functionName: "do_batch") { (interpreter: inout Interpreter) throws(ChatTemplateError) in
                if source == nil {
                    var arguments = arguments
                    guard let linecount = try interpreter.int(arguments.take(0, "linecount"), "linecount") else {
                        throw interpreter.error("do_batch() missing 1 required positional argument: 'linecount'")
                    }
                    size = linecount
                    fill = arguments.take(1, "fill_with")
                    source = try interpreter.cursor(over: value)
                }
                // jinja2 hands out a full batch only when the item after it arrives, so a size of 0 yields [] first.
                while let item = try source!.next(&interpreter) {
                    try interpreter.countIteration()
                    if pending.count == size {
                        let full = pending
                        pending = [item]
                        return .list(full)
                    }
                    pending.append(item)
                }
                guard !pending.isEmpty else { return nil }
                var last = pending
                pending = []
                if let fill, !fill.isNone, last.count < size {
                    last += Array(repeating: fill, count: size - last.count)
                }
                return .list(last)
            })
        default:
            throw error("no filter named '\(name)'")
        }
    }

    // MARK: Tests

    mutating func applyTest(_ name: String, to value: Value, _ arguments: CallArguments) throws(ChatTemplateError) -> Bool {
        var arguments = arguments
        func operand() throws(ChatTemplateError) -> Value {
            guard let other = arguments.take(0, name == "divisibleby" ? "num" : "b") else {
                throw error("test '\(name)' needs an argument")
            }
            return other
        }
        switch name {
        case "defined": return !value.isUndefined
        case "undefined": return value.isUndefined
        case "none":
            if case .none = value { return true }
            return false
        case "boolean":
            if case .bool = value { return true }
            return false
        case "true":
            if case .bool(true) = value { return true }
            return false
        case "false":
            if case .bool(false) = value { return true }
            return false
        case "integer":
            if case .int = value { return true }
            return false
        case "float":
            if case .double = value { return true }
            return false
        case "number": return value.number != nil
        case "string": return value.stringContent != nil
        case "mapping":
            if case .dict = value { return true }
            return false
        case "iterable":
            switch value {
            case .undefined, .string, .markup, .list, .tuple, .dict, .namespace, .generator: return true
            default: return false
            }
        case "sequence":
            switch value {
            case .undefined, .string, .markup, .list, .tuple, .dict: return true
            default: return false
            }
        case "callable":
            switch value {
            case .callable: return true
            default: return false
            }
        case "even", "odd":
            guard let number = value.integer else {
                if value.number != nil { return name == "even" ? fmod(value.number!, 2) == 0 : fmod(value.number!, 2) != 0 }
                throw error("test '\(name)' expects a number, got '\(value.typeName)'")
            }
            return (number % 2 == 0) == (name == "even")
        case "divisibleby":
            let divisor = try operand()
            guard let a = value.integer, let b = divisor.integer else {
                guard let a = value.number, let b = divisor.number, b != 0 else { throw error("divisibleby expects numbers") }
                return fmod(a, b) == 0
            }
            guard b != 0 else { throw error("integer division or modulo by zero") }
            return a % b == 0
        case "eq", "equalto", "==": return try compare("==", value, try operand())
        case "ne", "!=": return try compare("!=", value, try operand())
        case "lt", "lessthan", "<": return try compare("<", value, try operand())
        case "le", "<=": return try compare("<=", value, try operand())
        case "gt", "greaterthan", ">": return try compare(">", value, try operand())
        case "ge", ">=": return try compare(">=", value, try operand())
        case "in": return try contains(try operand(), value)
        case "sameas":
            let other = try operand()
            switch (value, other) {
            case (.none, .none): return true
            case let (.bool(a), .bool(b)): return a == b
            case let (.namespace(a), .namespace(b)): return a === b
            default: return false
            }
        case "lower":
            let content = text(value)
            return PythonStrings.lower(content) == content && PythonStrings.upper(content) != content
        case "upper":
            let content = text(value)
            return PythonStrings.upper(content) == content && PythonStrings.lower(content) != content
        case "escaped":
            if case .markup = value { return true }
            return false
        case "filter", "test":
            guard case let .string(target) = value else { return false }
            let known = name == "filter" ? Self.filterNames : Self.testNames
            return known.contains(target)
        default:
            throw error("no test named '\(name)'")
        }
    }

    static let filterNames: Set<String> = [
        "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
        "float", "forceescape", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
        "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum",
        "title", "tojson", "trim", "truncate", "unique", "upper", "wordcount",
    ]

    static let testNames: Set<String> = [
        "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
        "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt", "lessthan",
        "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
        "upper",
    ]

    // MARK: Methods

    private func bound(_ name: String, _ body: @escaping (inout Interpreter, inout CallArguments) throws(ChatTemplateError) -> Value) -> Value {
        .callable(Callable(name: name) { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            var arguments = arguments
            return try body(&interpreter, &arguments)
        })
    }

    private static let unsafeMethods: Set<String> = [
        "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault", "popitem",
    ]

    /// A bound method of a string, dict or list, or nil if the object has no method of that name.
    func method(_ name: String, of object: Value) -> Value? {
        switch object {
        case let .string(content): return stringMethod(name, content)
        case let .markup(content): return markupMethod(name, content)
        case let .dict(pairs):
            switch name {
            case "items": return bound(name) { _, _ in .list(pairs.map { .tuple([$0.0, $0.1]) }) }
            case "keys": return bound(name) { _, _ in .list(pairs.map(\.0)) }
            case "values": return bound(name) { _, _ in .list(pairs.map(\.1)) }
            case "get":
                return bound(name) { (_: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                    let key = arguments.take(0, "key") ?? .none
                    return object.lookup(key) ?? arguments.take(1, "default") ?? .none
                }
            case "copy": return bound(name) { _, _ in object }
            default: break
            }
        case let .list(values), let .tuple(values):
            switch name {
            case "index":
                return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                    let target = arguments.take(0, "value") ?? .none
                    guard let index = values.firstIndex(where: { $0.pythonEquals(target) }) else {
                        throw interpreter.error("\(target.pythonRepr) is not in list")
                    }
                    return .int(index)
                }
            case "count":
                return bound(name) { (_: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                    let target = arguments.take(0, "value") ?? .none
                    return .int(values.filter { $0.pythonEquals(target) }.count)
                }
            default: break
            }
        default:
            return nil
        }
        // The sandbox hands out an undefined value that prints as "" and fails when called.
        if Self.unsafeMethods.contains(name) {
            return .undefined("access to attribute '\(name)' of '\(object.typeName)' object is unsafe.")
        }
        return nil
    }

    func stringMethod(_ name: String, _ content: String) -> Value? {
        func stripper(leading: Bool, trailing: Bool) -> Value {
            bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                let characters = try interpreter.string(arguments.take(0, "chars"), "strip argument")
                return .string(PythonStrings.strip(content, characters, leading: leading, trailing: trailing))
            }
        }
        func affix(_ check: @escaping (String, String) -> Bool) -> Value {
            bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                let candidates: [Value]
                switch arguments.take(0, "prefix") {
                case let .string(single): candidates = [.string(single)]
                case let .tuple(many), let .list(many): candidates = many
                default: throw interpreter.error("\(name) first arg must be str or a tuple of str")
                }
                let scalars = Array(content.unicodeScalars)
                let start = max(0, min(scalars.count, try interpreter.int(arguments.take(1, "start"), "start") ?? 0))
                let end = max(start, min(scalars.count, try interpreter.int(arguments.take(2, "end"), "end") ?? scalars.count))
                let region = String(String.UnicodeScalarView(scalars[start..<end]))
                for candidate in candidates {
                    guard case let .string(text) = candidate else { throw interpreter.error("\(name) needs strings") }
                    if check(region, text) { return .bool(true) }
                }
                return .bool(false)
            }
        }
        func predicate(_ test: @escaping (Unicode.Scalar) -> Bool) -> Value {
            bound(name) { _, _ in .bool(!content.isEmpty && content.unicodeScalars.allSatisfy(test)) }
        }
        switch name {
        case "strip": return stripper(leading: true, trailing: true)
        case "lstrip": return stripper(leading: true, trailing: false)
        case "rstrip": return stripper(leading: false, trailing: true)
        case "split", "rsplit":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                let separator = try interpreter.string(arguments.take(0, "sep"), "separator")
                if separator == "" { throw interpreter.error("empty separator") }
                let maxSplit = try interpreter.int(arguments.take(1, "maxsplit"), "maxsplit") ?? -1
                let pieces = name == "split" ? PythonStrings.split(content, separator, maxSplit: maxSplit)
                    : PythonStrings.rsplit(content, separator, maxSplit: maxSplit)
                return .list(pieces.map { .string($0) })
            }
        case "splitlines":
            return bound(name) { (_: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                let keepEnds = arguments.take(0, "keepends")?.isTruthy ?? false
                return .list(PythonStrings.splitlines(content, keepEnds: keepEnds).map { .string($0) })
            }
        case "startswith": return affix(PythonStrings.hasPrefix)
        case "endswith": return affix(PythonStrings.hasSuffix)
        case "upper": return bound(name) { _, _ in .string(PythonStrings.upper(content)) }
        case "lower": return bound(name) { _, _ in .string(PythonStrings.lower(content)) }
        case "title": return bound(name) { _, _ in .string(PythonStrings.title(content)) }
        case "capitalize": return bound(name) { _, _ in .string(PythonStrings.capitalize(content)) }
        case "replace":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                guard let old = try interpreter.string(arguments.take(0, "old"), "old"),
                    let new = try interpreter.string(arguments.take(1, "new"), "new")
                else { throw interpreter.error("replace() needs two strings") }
                let count = try interpreter.int(arguments.take(2, "count"), "count") ?? -1
                let result = PythonStrings.replace(content, old, new, count: count)
                guard result.utf8.count <= Self.maximumBuiltSize else { throw interpreter.error("replaced string too large") }
                return .string(result)
            }
        case "find", "rfind", "index", "rindex":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                guard let needle = try interpreter.string(arguments.take(0, "sub"), "substring") else {
                    throw interpreter.error("\(name)() needs a string")
                }
                let position = PythonStrings.find(content, needle, reverse: name.hasPrefix("r"))
                if position < 0, name.hasSuffix("index") { throw interpreter.error("substring not found") }
                return .int(position)
            }
        case "count":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                guard let needle = try interpreter.string(arguments.take(0, "sub"), "substring") else {
                    throw interpreter.error("count() needs a string")
                }
                return .int(PythonStrings.count(content, needle))
            }
        case "join":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                var pieces: [String] = []
                for item in try interpreter.iterate(arguments.take(0, "iterable") ?? .list([])) {
                    guard let piece = item.stringContent else {
                        throw interpreter.error("sequence item: expected str instance, \(item.typeName) found")
                    }
                    pieces.append(piece)
                }
                let joined = pieces.joined(separator: content)
                guard joined.utf8.count <= Self.maximumBuiltSize else { throw interpreter.error("joined string too large") }
                return .string(joined)
            }
        case "removeprefix", "removesuffix":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                guard let affix = try interpreter.string(arguments.take(0, name == "removeprefix" ? "prefix" : "suffix"), "affix")
                else { throw interpreter.error("\(name)() needs a string") }
                let scalars = Array(content.unicodeScalars)
                let count = affix.unicodeScalars.count
                if name == "removeprefix", PythonStrings.hasPrefix(content, affix) {
                    return .string(String(String.UnicodeScalarView(scalars[count...])))
                }
                if name == "removesuffix", count > 0, PythonStrings.hasSuffix(content, affix) {
                    return .string(String(String.UnicodeScalarView(scalars[..<(scalars.count - count)])))
                }
                return .string(content)
            }
        case "format":
            return bound(name) { (interpreter: inout Interpreter, arguments: inout CallArguments) throws(ChatTemplateError) in
                try interpreter.format(content, arguments)
            }
        case "isdigit": return predicate { $0.properties.numericType == .decimal || $0.properties.numericType == .digit }
        case "isalpha": return predicate { $0.properties.isAlphabetic }
        case "isalnum": return predicate { $0.properties.isAlphabetic || $0.properties.numericType != nil }
        case "isspace": return predicate(isPythonWhitespace)
        case "islower":
            return bound(name) { _, _ in
                .bool(content.unicodeScalars.contains { $0.properties.isCased } && PythonStrings.lower(content) == content)
            }
        case "isupper":
            return bound(name) { _, _ in
                .bool(content.unicodeScalars.contains { $0.properties.isCased } && PythonStrings.upper(content) == content)
            }
        default: return nil
        }
    }

    /// `str.format` with `{}`, `{0}` and `{name}` fields (no format specs), as the sandbox's formatter allows.
    private func format(_ template: String, _ arguments: CallArguments) throws(ChatTemplateError) -> Value {
        var result = String.UnicodeScalarView()
        let scalars = Array(template.unicodeScalars)
        var index = 0
        var automatic = 0
        while index < scalars.count {
            let scalar = scalars[index]
            if scalar == "{", index + 1 < scalars.count, scalars[index + 1] == "{" {
                result.append("{")
                index += 2
            } else if scalar == "}", index + 1 < scalars.count, scalars[index + 1] == "}" {
                result.append("}")
                index += 2
            } else if scalar == "{" {
                guard let close = scalars[index...].firstIndex(of: "}") else { throw error("single '{' encountered in format string") }
                let field = String(String.UnicodeScalarView(scalars[(index + 1)..<close]))
                let value: Value?
                if field.isEmpty {
                    value = automatic < arguments.positional.count ? arguments.positional[automatic] : nil
                    automatic += 1
                } else if let position = Int(field) {
                    value = position < arguments.positional.count ? arguments.positional[position] : nil
                } else {
                    value = arguments.keyword.first { $0.0 == field }?.1
                }
                guard let value else { throw error("format field '{\(field)}' has no argument") }
                result.append(contentsOf: value.pythonString.unicodeScalars)
                index = close + 1
            } else if scalar == "}" {
                throw error("single '}' encountered in format string")
            } else {
                result.append(scalar)
                index += 1
            }
        }
        return .string(String(result))
    }

    // MARK: Globals

    /// `range`, `namespace`, `dict`, and transformers' `raise_exception` and `strftime_now`.
    /// - Parameter now: the time `strftime_now` formats (in the local time zone, as Python's `datetime.now()`); nil
    ///   reads the clock at each call.
    static func globals(file: String, now: Date?) -> [String: Value] {
        var globals: [String: Value] = [:]
        globals["range"] = .callable(Callable(name: "range") { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            var bounds: [Int] = []
            for value in arguments.positional {
                guard let integer = value.integer else {
                    throw interpreter.error("'\(value.typeName)' object cannot be interpreted as an integer")
                }
                bounds.append(integer)
            }
            let (start, stop, step): (Int, Int, Int)
            switch bounds.count {
            case 1: (start, stop, step) = (0, bounds[0], 1)
            case 2: (start, stop, step) = (bounds[0], bounds[1], 1)
            case 3: (start, stop, step) = (bounds[0], bounds[1], bounds[2])
            default: throw interpreter.error("range expected 1 to 3 integer arguments")
            }
            guard step != 0 else { throw interpreter.error("range() arg 3 must not be zero") }
            let count = step > 0 ? (stop > start ? (stop - start - 1) / step + 1 : 0)
                : (start > stop ? (start - stop - 1) / -step + 1 : 0)
            guard count <= Self.maximumRange else {
                throw interpreter.error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (\(Self.maximumRange)).")
            }
            return .list((0..<count).map { .int(start + $0 * step) })
        })
        globals["namespace"] = .callable(Callable(name: "namespace") { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            var attributes: [(String, Value)] = []
            for positional in arguments.positional {
                guard case let .dict(pairs) = positional else { throw interpreter.error("namespace() takes a mapping") }
                for (key, value) in pairs {
                    guard case let .string(name) = key else { throw interpreter.error("namespace keys must be strings") }
                    attributes.append((name, value))
                }
            }
            attributes += arguments.keyword
            let namespace = Namespace(attributes: [])
            interpreter.references.created(namespace)
            for (name, value) in attributes {
                guard !name.hasPrefix("_") else {
                    throw interpreter.error("chat templates cannot store underscore-prefixed attributes on a namespace, but got '\(name)'")
                }
                namespace[name] = value
            }
            return .namespace(namespace)
        })
        globals["dict"] = .callable(Callable(name: "dict") { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            var pairs: [(Value, Value)] = []
            func set(_ key: Value, _ value: Value) {
                if let index = pairs.firstIndex(where: { $0.0.pythonEquals(key) }) { pairs[index].1 = value } else { pairs.append((key, value)) }
            }
            if let first = arguments.positional.first {
                if case let .dict(existing) = first {
                    for (key, value) in existing { set(key, value) }
                } else {
                    for item in try interpreter.iterate(first) {
                        let pair = try interpreter.iterate(item)
                        guard pair.count == 2 else { throw interpreter.error("dictionary update sequence element has length \(pair.count); 2 is required") }
                        set(pair[0], pair[1])
                    }
                }
            }
            for (name, value) in arguments.keyword { set(.string(name), value) }
            return .dict(pairs)
        })
        globals["raise_exception"] = .callable(Callable(name: "raise_exception") { (_: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            throw .raised(file: file, message: arguments.positional.first?.pythonString ?? "")
        })
        globals["strftime_now"] = .callable(Callable(name: "strftime_now") { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            guard case let .string(format)? = arguments.positional.first else { throw interpreter.error("strftime_now() needs a format string") }
            var seconds = now.map { time_t($0.timeIntervalSince1970.rounded(.down)) } ?? time(nil)
            var parts = tm()
            localtime_r(&seconds, &parts)
            var buffer = [CChar](repeating: 0, count: 512)
            let length = strftime(&buffer, buffer.count, format, &parts)
            return .string(String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self))
        })
        return globals
    }
}
