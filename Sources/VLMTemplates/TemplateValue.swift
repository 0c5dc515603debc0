/// A missing value. Printing it gives "", testing it gives false; most other uses raise `message`.
struct UndefinedValue {
    let message: String
}

/// jinja2's `namespace()`: the one mutable object templates can write to across loop scopes.
final class Namespace {
    var attributes: [(String, Value)]

    init(attributes: [(String, Value)]) {
        self.attributes = attributes
    }

    subscript(name: String) -> Value? {
        get { attributes.first { $0.0.utf8.elementsEqual(name.utf8) }?.1 }
        set {
            if let index = attributes.firstIndex(where: { $0.0.utf8.elementsEqual(name.utf8) }) {
                attributes[index].1 = newValue ?? .none
            } else {
                attributes.append((name, newValue ?? .none))
            }
        }
    }
}

/// The `loop` variable of a `for` block. It pulls items from its iterable only as far as the loop and its attributes
/// need them, as jinja2's LoopContext does, so that breaking out of a loop over a generator leaves the rest unconsumed.
final class LoopState {
    /// The items pulled so far.
    private(set) var items: [Value] = []
    private var source: ValueCursor
    private var sourceExhausted = false
    var index0 = 0
    let depth0: Int
    let recurse: Value?

    init(source: ValueCursor, depth0: Int, recurse: Value?) {
        self.source = source
        self.depth0 = depth0
        self.recurse = recurse
    }

    /// The item at `index`, pulling items up to it; nil past the end.
    func item(at index: Int, _ interpreter: inout Interpreter) throws(ChatTemplateError) -> Value? {
        while items.count <= index, !sourceExhausted {
            if let item = try source.next(&interpreter) { items.append(item) } else { sourceExhausted = true }
        }
        return index < items.count ? items[index] : nil
    }

    /// The number of items, pulling all of them.
    func length(_ interpreter: inout Interpreter) throws(ChatTemplateError) -> Int {
        while try item(at: items.count, &interpreter) != nil {}
        return items.count
    }
}

/// A function templates can call: a macro, a global such as `range`, or a bound method such as `str.split`.
struct Callable {
    let name: String
    let call: (inout Interpreter, CallArguments) throws(ChatTemplateError) -> Value
}

/// Evaluated call arguments.
struct CallArguments {
    var positional: [Value] = []
    var keyword: [(String, Value)] = []
    let offset: Int

    /// Takes the argument at `position` or named `name`, in Python's way.
    mutating func take(_ position: Int, _ name: String) -> Value? {
        if let index = keyword.firstIndex(where: { $0.0 == name }) {
            return keyword.remove(at: index).1
        }
        return position >= 0 && position < positional.count ? positional[position] : nil
    }
}

/// A value while a template runs: Python's types as chat templates use them.
enum Value {
    case undefined(UndefinedValue)
    case none
    case bool(Bool)
    case int(Int)
    case double(Double)
    case string(String)
    /// markupsafe's `Markup`, from `|safe` and `|escape`: a str whose operators HTML-escape their plain operands.
    case markup(String)
    case list([Value])
    case tuple([Value])
    case dict([(Value, Value)])
    case namespace(Namespace)
    case loop(LoopState)
    case callable(Callable)
    case generator(TemplateGenerator)

    static func undefined(_ message: String) -> Value { .undefined(UndefinedValue(message: message)) }

    init(_ json: JSONValue) {
        switch json {
        case .null: self = .none
        case let .bool(value): self = .bool(value)
        case let .int(value): self = .int(value)
        case let .double(value): self = .double(value)
        case let .string(value): self = .string(value)
        case let .array(values): self = .list(values.map(Value.init))
        case let .object(pairs): self = .dict(pairs.map { (.string($0.0), Value($0.1)) })
        }
    }

    init(_ literal: Literal) {
        switch literal {
        case .none: self = .none
        case let .bool(value): self = .bool(value)
        case let .int(value): self = .int(value)
        case let .double(value): self = .double(value)
        case let .string(value): self = .string(value)
        }
    }

    /// Python's type name, for error messages.
    var typeName: String {
        switch self {
        case .undefined: "Undefined"
        case .none: "NoneType"
        case .bool: "bool"
        case .int: "int"
        case .double: "float"
        case .string: "str"
        case .markup: "Markup"
        case .list: "list"
        case .tuple: "tuple"
        case .dict: "dict"
        case .namespace: "Namespace"
        case .loop: "LoopContext"
        case .callable: "function"
        case .generator: "generator"
        }
    }

    var isNone: Bool {
        if case .none = self { return true }
        return false
    }

    var isUndefined: Bool {
        if case .undefined = self { return true }
        return false
    }

    /// Python truthiness.
    var isTruthy: Bool {
        switch self {
        case .undefined, .none: false
        case let .bool(value): value
        case let .int(value): value != 0
        case let .double(value): value != 0
        case let .string(value), let .markup(value): !value.isEmpty
        case let .list(values), let .tuple(values): !values.isEmpty
        case let .dict(pairs): !pairs.isEmpty
        case .namespace, .loop, .callable, .generator: true
        }
    }

    /// The value as a number for arithmetic (bools are ints in Python).
    var number: Double? {
        switch self {
        case let .int(value): Double(value)
        case let .bool(value): value ? 1 : 0
        case let .double(value): value
        default: nil
        }
    }

    var integer: Int? {
        switch self {
        case let .int(value): value
        case let .bool(value): value ? 1 : 0
        default: nil
        }
    }

    /// The text of a str, Markup or not.
    var stringContent: String? {
        switch self {
        case let .string(text), let .markup(text): text
        default: nil
        }
    }

    /// Python `==`.
    func pythonEquals(_ other: Value) -> Bool {
        if let a = stringContent, let b = other.stringContent { return a.utf8.elementsEqual(b.utf8) }
        switch (self, other) {
        case (.undefined, .undefined), (.none, .none): return true
        case let (.list(a), .list(b)), let (.tuple(a), .tuple(b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.pythonEquals($1) }
        case let (.dict(a), .dict(b)):
            return a.count == b.count && a.allSatisfy { pair in
                b.contains { $0.0.pythonEquals(pair.0) && $0.1.pythonEquals(pair.1) }
            }
        case let (.namespace(a), .namespace(b)): return a === b
        case let (.loop(a), .loop(b)): return a === b
        case let (.generator(a), .generator(b)): return a === b
        default:
            if let a = integer, let b = other.integer { return a == b }
            if let a = number, let b = other.number { return a == b }
            return false
        }
    }

    /// The value of `key` in a dict.
    func lookup(_ key: Value) -> Value? {
        guard case let .dict(pairs) = self else { return nil }
        return pairs.first { $0.0.pythonEquals(key) }?.1
    }

    /// Python `str()`.
    var pythonString: String {
        switch self {
        case .undefined: ""
        case let .string(value), let .markup(value): value
        default: pythonRepr
        }
    }

    /// Python `repr()`.
    var pythonRepr: String {
        switch self {
        case .undefined: ""
        case .none: "None"
        case let .bool(value): value ? "True" : "False"
        case let .int(value): String(value)
        case let .double(value): pythonFloatRepr(value)
        case let .string(value): pythonStringRepr(value)
        case let .markup(value): "Markup(" + pythonStringRepr(value) + ")"
        case let .list(values): "[" + values.map(\.pythonRepr).joined(separator: ", ") + "]"
        case let .tuple(values):
            values.count == 1 ? "(" + values[0].pythonRepr + ",)"
                : "(" + values.map(\.pythonRepr).joined(separator: ", ") + ")"
        case let .dict(pairs): "{" + pairs.map { $0.0.pythonRepr + ": " + $0.1.pythonRepr }.joined(separator: ", ") + "}"
        case let .namespace(namespace):
            "<Namespace " + Value.dict(namespace.attributes.map { (.string($0.0), $0.1) }).pythonRepr + ">"
        case .loop: "<LoopContext>"
        case let .callable(callable): "<function \(callable.name)>"
        case let .generator(generator): generator.pythonRepr
        }
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional for exponents -4..<16.
func pythonFloatRepr(_ value: Double) -> String {
    if value.isNaN { return "nan" }
    if value.isInfinite { return value < 0 ? "-inf" : "inf" }
    if value == 0 { return value.sign == .minus ? "-0.0" : "0.0" }
    // Swift's description also gives the shortest round-trip digits; only the layout differs from Python's.
    var text = "\(value.magnitude)"
    var exponent = 0
    if let e = text.firstIndex(where: { $0 == "e" || $0 == "E" }) {
        exponent = Int(text[text.index(after: e)...])!
        text = String(text[..<e])
    }
    var digits = text.filter { $0 != "." }
    let pointPosition = (text.firstIndex(of: ".").map { text.distance(from: text.startIndex, to: $0) } ?? text.count)
    var decimalExponent = pointPosition + exponent - 1
    while digits.hasPrefix("0"), digits.count > 1 {
        digits.removeFirst()
        decimalExponent -= 1
    }
    while digits.hasSuffix("0"), digits.count > 1 { digits.removeLast() }
    let sign = value < 0 ? "-" : ""
    if decimalExponent < -4 || decimalExponent >= 16 {
        let mantissa = digits.count == 1 ? digits : String(digits.first!) + "." + digits.dropFirst()
        let exponentText = String(abs(decimalExponent))
        return sign + mantissa + "e" + (decimalExponent < 0 ? "-" : "+") + (exponentText.count < 2 ? "0" : "") + exponentText
    }
    if decimalExponent < 0 {
        return sign + "0." + String(repeating: "0", count: -decimalExponent - 1) + digits
    }
    if digits.count <= decimalExponent + 1 {
        return sign + digits + String(repeating: "0", count: decimalExponent + 1 - digits.count) + ".0"
    }
    let split = digits.index(digits.startIndex, offsetBy: decimalExponent + 1)
    return sign + digits[..<split] + "." + digits[split...]
}

/// Python's `repr(str)`.
func pythonStringRepr(_ value: String) -> String {
    let quote: Unicode.Scalar = value.contains("'") && !value.contains("\"") ? "\"" : "'"
    var result = String.UnicodeScalarView()
    result.append(quote)
    for scalar in value.unicodeScalars {
        switch scalar {
        case "\\": result.append(contentsOf: "\\\\".unicodeScalars)
        case "\n": result.append(contentsOf: "\\n".unicodeScalars)
        case "\r": result.append(contentsOf: "\\r".unicodeScalars)
        case "\t": result.append(contentsOf: "\\t".unicodeScalars)
        case quote: result.append("\\"); result.append(quote)
        default:
            if isPythonPrintable(scalar) {
                result.append(scalar)
            } else {
                let hex = String(scalar.value, radix: 16)
                let escape = scalar.value < 0x100 ? "\\x" + String(repeating: "0", count: 2 - hex.count) + hex
                    : scalar.value < 0x10000 ? "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                    : "\\U" + String(repeating: "0", count: 8 - hex.count) + hex
                result.append(contentsOf: escape.unicodeScalars)
            }
        }
    }
    result.append(quote)
    return String(result)
}

/// Python's `str.isprintable` for one character: not a control, format, separator (other than space),
/// surrogate, private-use or unassigned code point.
private func isPythonPrintable(_ scalar: Unicode.Scalar) -> Bool {
    if scalar == " " { return true }
    switch scalar.properties.generalCategory {
    case .control, .format, .surrogate, .privateUse, .unassigned, .lineSeparator, .paragraphSeparator, .spaceSeparator:
        return false
    default:
        return true
    }
}
