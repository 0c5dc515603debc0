import VLMTemplates

/// JSON schemas as GBNF grammars, written as llama.cpp writes them (`json_schema_to_grammar`): the same rules under
/// the same names, so that a `response_format` schema constrains generation here exactly as it does in llama-server,
/// and llama.cpp's own test corpus holds this conversion to that.
public enum JSONSchemaGrammar {
    /// Converts a schema (OpenAI's `response_format.json_schema.schema`, llama-server's `json_schema`).
    ///
    /// Keywords outside llama.cpp's subset (`uniqueItems`, `minimum` on numbers, ...) constrain nothing; a `pattern`
    /// with no grammar equivalent (a look-ahead, `\w`, an unanchored one) accepts any string and says so in
    /// `warnings`, as llama.cpp does.
    ///
    /// - Throws: `GrammarError.invalidSchema`, with llama.cpp's message, for what llama.cpp refuses: an unknown or
    ///   malformed `type`, a malformed keyword of the subset, a `$ref` outside the document or that does not
    ///   resolve, a `pattern` that is not a valid regular expression.
    public static func convert(_ schema: JSONValue) throws(GrammarError) -> JSONSchemaConversion {
        let document: JSONSchemaDocument
        do {
            document = try JSONSchemaDocument(schema)
        } catch {
            throw .invalidSchema(error.message)
        }
        var writer = GrammarWriter(references: document.references)
        _ = writer.visit(document.root, name: "")
        if let abort = writer.abort { throw .invalidSchema(abort) }
        guard writer.errors.isEmpty else { throw .invalidSchema(writer.errors.joined(separator: "; ")) }
        return JSONSchemaConversion(grammar: writer.grammar, warnings: writer.warnings)
    }
}

/// A schema's grammar, and what of the schema it could not express.
public struct JSONSchemaConversion: Sendable {
    /// GBNF with `root` as its start: one `name ::= body` line per rule, each ending in "\n", rules sorted by the
    /// bytes of their names as llama.cpp's `std::map` sorts them, so that the text is llama.cpp's byte for byte.
    public var grammar: String
    /// Where the grammar accepts more than the schema, in llama.cpp's words (its "JSON schema conversion was
    /// incomplete" warning): a caller may want to tell the user that the output is only partly validated.
    public var warnings: [String]
}

/// The rules llama.cpp adds by name when a schema needs them, with the rules they use.
private enum BuiltinRule: String, CaseIterable {
    case boolean
    case decimalPart = "decimal-part"
    case integralPart = "integral-part"
    case number
    case integer
    case value
    case object
    case array
    case uuid
    case char
    case string
    case null
    case date
    case time
    case dateTime = "date-time"
    case dateString = "date-string"
    case timeString = "time-string"
    case dateTimeString = "date-time-string"

    var body: String {
        switch self {
        case .boolean: #"("true" | "false")"#
        case .decimalPart: "[0-9]{1,16}"
        case .integralPart: "[0] | [1-9] [0-9]{0,15}"
        case .number: #"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#
        case .integer: #"("-"? integral-part)"#
        case .value: "object | array | string | number | boolean | null"
        case .object: #""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#
        case .array: #""[" space ( value ("," space value)* )? space "]""#
        case .uuid:
            #""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#
        case .char: #"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#
        case .string: #""\"" char* "\"""#
        case .null: #""null""#
        case .date: #"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#
        case .time:
            #"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#
        case .dateTime: #"date "T" time"#
        case .dateString: #""\"" date "\"""#
        case .timeString: #""\"" time "\"""#
        case .dateTimeString: #""\"" date-time "\"""#
        }
    }

    var dependencies: [BuiltinRule] {
        switch self {
        case .number: [.integralPart, .decimalPart]
        case .integer: [.integralPart]
        case .value: [.object, .array, .string, .number, .boolean, .null]
        case .object: [.string, .value]
        case .array: [.value]
        case .string: [.char]
        case .dateTime: [.date, .time]
        case .dateString: [.date]
        case .timeString: [.time]
        case .dateTimeString: [.dateTime]
        default: []
        }
    }

    /// Names a schema's own rules may not take: one that would gets a "-" appended.
    static let reservedNames = Set(allCases.map { ExactString($0.rawValue) } + [ExactString("root")])
}

/// Unbounded, in a repetition: llama.cpp's `INT_MAX`, so that a bound of 2147483647 is none there too.
private let unbounded = Int(Int32.max)

/// The converter's state: rules so far, by name, and what went wrong or had to be loosened.
private struct GrammarWriter {
    let references: [ExactString: JSONSchemaNode]
    /// Rule names are ASCII (`escapedRuleName`), so `String` keys compare as bytes.
    var rules = ["space": #"| " " | "\n"{1,2} [ \t]{0,20}"#]
    var referencesBeingResolved: Set<ExactString> = []
    var errors: [String] = []
    /// An error that ends the conversion at once in llama.cpp (an exception), whatever else went wrong.
    var abort: String?
    var warnings: [String] = []

    init(references: [ExactString: JSONSchemaNode]) { self.references = references }

    var grammar: String {
        rules.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
            .map { "\($0.key) ::= \($0.value)\n" }.joined()
    }

    /// Adds `body` under `name` (runs of characters other than letters, digits and "-" become one "-") and returns
    /// the name it got: the same body under the same name is one rule, a different one takes the first free numeric
    /// suffix.
    mutating func addRule(_ name: String, _ body: String) -> String {
        let escaped = Self.escapedRuleName(name)
        guard let existing = rules[escaped], !existing.utf8.elementsEqual(body.utf8) else {
            rules[escaped] = body
            return escaped
        }
        var suffix = 0
        while let other = rules["\(escaped)\(suffix)"], !other.utf8.elementsEqual(body.utf8) { suffix += 1 }
        rules["\(escaped)\(suffix)"] = body
        return "\(escaped)\(suffix)"
    }

    static func escapedRuleName(_ name: String) -> String {
        var escaped: [UInt8] = []
        var inRun = false
        for byte in name.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"):
                escaped.append(byte)
                inRun = false
            default:
                if !inRun { escaped.append(UInt8(ascii: "-")) }
                inRun = true
            }
        }
        return String(decoding: escaped, as: UTF8.self)
    }

    mutating func addBuiltin(_ name: String, _ rule: BuiltinRule) -> String {
        let added = addRule(name, rule.body)
        for dependency in rule.dependencies where rules[dependency.rawValue] == nil {
            _ = addBuiltin(dependency.rawValue, dependency)
        }
        return added
    }

    /// A builtin under its own name, or as the body of `root`.
    mutating func visitBuiltin(_ ruleName: String, _ rule: BuiltinRule) -> String {
        addBuiltin(ruleName == "root" ? "root" : rule.rawValue, rule)
    }

    /// The rule matching `node`, named after `name` (the path of property names, "" at the top), or a builtin's name.
    mutating func visit(_ node: JSONSchemaNode, name: String) -> String {
        let ruleName = BuiltinRule.reservedNames.contains(ExactString(name)) ? name + "-" : name.isEmpty ? "root" : name
        let subName = name.isEmpty ? "" : name + "-"
        switch node {
        case let .reference(reference):
            return addRule(ruleName, resolve(reference))
        case let .anyOf(alternatives):
            var branches: [String] = []
            for (index, alternative) in alternatives.enumerated() {
                branches.append(visit(alternative, name: name + (name.isEmpty ? "alternative-" : "-") + String(index)))
            }
            return addRule(ruleName, branches.joined(separator: " | "))
        case let .allOf(children):
            return visitAllOf(children, name: name, ruleName: ruleName)
        case let .constant(value):
            return addRule(ruleName, Grammar.literal(value.compactText))
        case let .enumeration(values):
            return addRule(ruleName, "(" + values.map { Grammar.literal($0.compactText) }.joined(separator: " | ") + ")")
        case let .object(properties, additional):
            if properties.isEmpty, case .any? = additional {
                return addRule(ruleName, addBuiltin("object", .object))
            }
            let required = Set(properties.filter(\.required).map { ExactString($0.name) })
            return addRule(ruleName, objectRule(properties.map { ($0.name, $0.schema) }, required: required, name: name,
                                                additional: additional))
        case let .tuple(items):
            var elements: [String] = []
            for (index, item) in items.enumerated() { elements.append(visit(item, name: subName + "tuple-\(index)")) }
            return addRule(ruleName, #""[" space "# + elements.joined(separator: #" "," space "#) + #" space "]""#)
        case let .array(items, minItems, maxItems):
            if case .any = items, minItems == 0, maxItems == nil { return visitBuiltin(ruleName, .array) }
            let item = visit(items, name: subName + "item")
            let list = Self.repetition(item, min: minItems, max: maxItems ?? unbounded, separator: #""," space"#)
            return addRule(ruleName, #""[" space "# + list + #" space "]""#)
        case let .string(pattern, format, minLength, maxLength):
            if !pattern.isEmpty { return visitPattern(pattern, name: ruleName) }
            switch format {
            case .uuid?: return visitBuiltin(ruleName, .uuid)
            case .date?: return addRule(ruleName, addBuiltin("date-string", .dateString))
            case .time?: return addRule(ruleName, addBuiltin("time-string", .timeString))
            case .dateTime?: return addRule(ruleName, addBuiltin("date-time-string", .dateTimeString))
            case nil: break
            }
            guard minLength > 0 || maxLength != nil else { return visitBuiltin(ruleName, .string) }
            let char = addBuiltin("char", .char)
            return addRule(ruleName, #""\"" "# + Self.repetition(char, min: minLength, max: maxLength ?? unbounded)
                + #" "\"""#)
        case let .integer(minimum, maximum):
            if minimum == .min && maximum == .max { return visitBuiltin(ruleName, .integer) }
            var range = IntegerRange()
            do {
                try range.write(minimum: minimum, maximum: maximum)
            } catch {
                // A bound of Int64.min (e.g. "maximum": -9223372036854775808, or a double beyond Int64) leaves none.
                abort = abort ?? "At least one of min_value or max_value must be set"
                return ""
            }
            return addRule(ruleName, "(" + range.text + ")")
        case .number: return visitBuiltin(ruleName, .number)
        case .boolean: return visitBuiltin(ruleName, .boolean)
        case .null: return visitBuiltin(ruleName, .null)
        case .any: return addRule(ruleName, addBuiltin("value", .value))
        }
    }

    /// The rule of a `$ref`'s target, named after the reference ("#/definitions/foo": ref-definitions-foo), built
    /// once; a reference back to one being built refers to it by that name.
    private mutating func resolve(_ reference: String) -> String {
        // Every reference starts with "#/" (`JSONSchemaDocument` refuses others); the name is made of what follows "#".
        var name = "ref" + Self.escapedRuleName(String(decoding: reference.utf8.dropFirst(), as: UTF8.self))
        let key = ExactString(reference)
        if rules[name] == nil && !referencesBeingResolved.contains(key) {
            guard let target = references[key] else {
                errors.append("Unresolved $ref \(reference)")
                return ""
            }
            referencesBeingResolved.insert(key)
            name = visit(target, name: name)
            referencesBeingResolved.remove(key)
        }
        return name
    }

    /// `allOf`: the properties of its object parts (those inside an `anyOf` part optional), or the values common to
    /// all its parts when they are enums.
    private mutating func visitAllOf(_ children: [JSONSchemaNode], name: String, ruleName: String) -> String {
        var properties: [(String, JSONSchemaNode)] = []
        var required: Set<ExactString> = []
        var enumCounts: [ExactString: Int] = [:]
        // `seen` stops a `$ref` cycle, which llama.cpp would follow until its stack overflows.
        func add(_ node: JSONSchemaNode, required isRequired: Bool, seen: Set<ExactString>) {
            switch node {
            case let .reference(reference):
                let key = ExactString(reference)
                if !seen.contains(key), let target = references[key] {
                    add(target, required: isRequired, seen: seen.union([key]))
                }
            case let .object(objectProperties, _):
                for property in objectProperties {
                    properties.append((property.name, property.schema))
                    if isRequired { required.insert(ExactString(property.name)) }
                }
            case let .enumeration(values):
                for value in values { enumCounts[ExactString(Grammar.literal(value.compactText)), default: 0] += 1 }
            default:
                break
            }
        }
        for child in children {
            if case let .anyOf(alternatives) = child {
                for alternative in alternatives { add(alternative, required: false, seen: []) }
            } else {
                add(child, required: true, seen: [])
            }
        }
        let common = enumCounts.filter { $0.value == children.count }.keys.sorted()
        if !common.isEmpty {
            let values = common.map { String(decoding: $0.bytes, as: UTF8.self) }
            return addRule(ruleName, "(" + values.joined(separator: " | ") + ")")
        }
        return addRule(ruleName, objectRule(properties, required: required, name: name, additional: nil))
    }

    /// Properties in schema order, required ones first and all of them; then any subset of the optional ones (and
    /// of other keys, when `additional` allows them), still in order, through one "-rest" rule per optional one.
    private mutating func objectRule(_ properties: [(String, JSONSchemaNode)], required: Set<ExactString>, name: String,
                                     additional: JSONSchemaNode?) -> String {
        let prefix = name.isEmpty ? "" : name + "-"
        // "*" stands for the other keys, as in llama.cpp (where a property named "*" is taken for them too).
        let otherKeys = "*"
        var requiredNames: [String] = []
        var optionalNames: [String] = []
        var keyValueRules: [ExactString: String] = [:]
        var names: [String] = []
        for (propertyName, schema) in properties {
            let valueRule = visit(schema, name: prefix + propertyName)
            keyValueRules[ExactString(propertyName)] = addRule(prefix + propertyName + "-kv",
                                                               Grammar.literal(JSONValue.string(propertyName).compactText)
                                                                   + #" space ":" space "# + valueRule)
            if required.contains(ExactString(propertyName)) {
                requiredNames.append(propertyName)
            } else {
                optionalNames.append(propertyName)
            }
            names.append(propertyName)
        }
        if let additional {
            let subName = prefix + "additional"
            let valueRule: String
            if case .any = additional {
                valueRule = addBuiltin("value", .value)
            } else {
                valueRule = visit(additional, name: subName + "-value")
            }
            let keyRule = names.isEmpty ? addBuiltin("string", .string) : addRule(subName + "-k", notStrings(names))
            keyValueRules[ExactString(otherKeys)] = addRule(subName + "-kv", keyRule + #" ":" space "# + valueRule)
            optionalNames.append(otherKeys)
        }
        if requiredNames.isEmpty && optionalNames.isEmpty { return #""{" space "}""# }

        func keyValue(_ name: String) -> String { keyValueRules[ExactString(name)] ?? "" }
        /// The first of `names` (or, when `firstIsOptional`, a comma and it, optionally) then the rest's rule.
        func sequence(_ names: ArraySlice<String>, firstIsOptional: Bool) -> String {
            guard let first = names.first else { return "" }
            let isOtherKeys = first.utf8.elementsEqual(otherKeys.utf8)
            let commaRef = #"( "," space "# + keyValue(first) + " )"
            var result = firstIsOptional ? commaRef + (isOtherKeys ? "*" : "?")
                : keyValue(first) + (isOtherKeys ? " " + commaRef + "*" : "")
            if names.count > 1 {
                result += " " + addRule(prefix + first + "-rest", sequence(names.dropFirst(), firstIsOptional: true))
            }
            return result
        }

        var rule = #""{" space "# + requiredNames.map(keyValue).joined(separator: #" "," space "#)
        if !optionalNames.isEmpty {
            rule += " ("
            if !requiredNames.isEmpty { rule += #" "," space ( "# }
            rule += optionalNames.indices.map { sequence(optionalNames[$0...], firstIsOptional: false) }
                .joined(separator: " | ")
            if !requiredNames.isEmpty { rule += " )" }
            rule += " )?"
        }
        return rule + #" space "}""#
    }

    /// A JSON string that is none of `strings`, from the trie of their characters:
    /// `["] ( [a] char+ | [^"a] char* )? ["]` for "a". Characters go into the classes as they are, unescaped.
    private mutating func notStrings(_ strings: [String]) -> String {
        var trie = CharacterTrie()
        for string in strings { trie.insert(string) }
        let char = addBuiltin("char", .char)
        func alternatives(_ node: Int) -> String {
            let children = trie.nodes[node].children.sorted { $0.key.value < $1.key.value }
            guard !children.isEmpty else { return "" }
            var text = ""
            var rejected = ""
            for (index, (character, child)) in children.enumerated() {
                rejected.unicodeScalars.append(character)
                text += (index == 0 ? "[" : " | [") + String(character) + "]"
                text += trie.nodes[child].children.isEmpty ? " \(char)+" : " (" + alternatives(child) + ")"
            }
            return text + #" | [^""# + rejected + "] \(char)*"
        }
        return #"["] ( "# + alternatives(0) + " )" + (trie.nodes[0].isWord ? "" : "?") + #" ["]"#
    }

    /// `pattern` (a regular expression anchored at both ends) as a rule matching the JSON strings it matches, or
    /// `string` with a warning when the grammar cannot express it; an error when it is not a regular expression.
    private mutating func visitPattern(_ pattern: String, name: String) -> String {
        let saved = rules
        do {
            return try patternRule(pattern, name: name)
        } catch {
            rules = saved
            switch error {
            case let .unsupported(reason):
                warnings.append("pattern \(pattern) is not supported (\(reason)), accepting any string")
                return addRule(name, addBuiltin("string", .string))
            case let .invalid(reason):
                errors.append("Invalid pattern \(pattern): \(reason)")
                return ""
            }
        }
    }

    private mutating func patternRule(_ pattern: String, name: String) throws(PatternFailure) -> String {
        let bytes = Array(pattern.utf8)
        guard bytes.count >= 2, bytes.first == UInt8(ascii: "^"), bytes.last == UInt8(ascii: "$") else {
            throw .unsupported("not anchored with '^' and '$'")
        }
        var reader = PatternReader(pattern: Array(bytes[1..<bytes.count - 1]), name: name)
        let body = try reader.sequence(&self)
        guard reader.depth == 0 else { throw .invalid("unbalanced parentheses") }
        return addRule(name, #""\"" ("# + String(decoding: body, as: UTF8.self) + #") "\"""#)
    }

    /// `item` repeated `min` to `max` times (`unbounded`: no maximum), each after the first preceded by `separator`.
    static func repetition(_ item: String, min: Int, max: Int, separator: String = "") -> String {
        if max == 0 { return "" }
        if min == 0 && max == 1 { return item + "?" }
        let hasMax = max != unbounded
        guard !separator.isEmpty else {
            if min == 1 && !hasMax { return item + "+" }
            if min == 0 && !hasMax { return item + "*" }
            return item + "{\(min)," + (hasMax ? String(max) : "") + "}"
        }
        let result = item + " " + repetition("(" + separator + " " + item + ")", min: min == 0 ? 0 : min - 1,
                                             max: hasMax ? max - 1 : max)
        return min == 0 ? "(" + result + ")?" : result
    }

}

private enum PatternFailure: Error {
    /// A valid regular expression the grammar cannot express: the string is left unconstrained.
    case unsupported(String)
    /// Not a regular expression: the conversion fails.
    case invalid(String)
}

/// llama.cpp's reading of a `pattern`, byte by byte: literals, `.`, groups (capturing or `(?:`), alternation,
/// character classes copied as GBNF classes, and the `*` `+` `?` `{m,n}` quantifiers.
private struct PatternReader {
    let pattern: [UInt8]
    let name: String
    var position = 0
    var depth = 0
    /// Bodies repeated with `{m,n}`, each a rule of its own: name-1, name-2, ...
    var repeatedRules: [[UInt8]: String] = [:]

    private static let maximumDepth = 100
    /// Characters that are not literals when they stand unescaped.
    private static let operators = Set("|.()[]{}*+?^$".utf8)

    private struct Item {
        var text: [UInt8]
        var isLiteral: Bool

        var rule: [UInt8] { isLiteral ? [UInt8(ascii: "\"")] + text + [UInt8(ascii: "\"")] : text }
    }

    /// The items up to the `)` closing the current group, or to the end, as one rule text; consecutive literals are
    /// one literal.
    mutating func sequence(_ writer: inout GrammarWriter) throws(PatternFailure) -> [UInt8] {
        var items: [Item] = []
        while position < pattern.count {
            let current = pattern[position]
            switch current {
            case UInt8(ascii: "."):
                items.append(Item(text: Array(writer.addRule("dot", #"[^\x0A\x0D]"#).utf8), isLiteral: false))
                position += 1
            case UInt8(ascii: "("):
                position += 1
                if position < pattern.count && pattern[position] == UInt8(ascii: "?") {
                    // (?: is a plain group; look-arounds, named groups and inline flags have no equivalent.
                    guard position + 1 < pattern.count && pattern[position + 1] == UInt8(ascii: ":") else {
                        throw .unsupported("unsupported group syntax")
                    }
                    position += 2
                }
                depth += 1
                guard depth <= Self.maximumDepth else { throw .unsupported("pattern nesting too deep") }
                let group = try sequence(&writer)
                items.append(Item(text: [UInt8(ascii: "(")] + group + [UInt8(ascii: ")")], isLiteral: false))
            case UInt8(ascii: ")"):
                position += 1
                guard depth > 0 else { throw .invalid("unbalanced parentheses") }
                depth -= 1
                return Self.joined(items)
            case UInt8(ascii: "^"), UInt8(ascii: "$"):
                throw .unsupported("anchor inside the pattern")
            case UInt8(ascii: "["):
                items.append(Item(text: try characterClass(), isLiteral: false))
            case UInt8(ascii: "|"):
                items.append(Item(text: [current], isLiteral: false))
                position += 1
            case UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "?"):
                guard let last = items.popLast() else { throw .invalid("nothing to repeat") }
                items.append(Item(text: last.rule + [current], isLiteral: false))
                position += 1
            case UInt8(ascii: "{"):
                let (minimum, maximum) = try repetitionBounds()
                guard var last = items.popLast() else { throw .invalid("nothing to repeat") }
                if !last.isLiteral {
                    if let rule = repeatedRules[last.text] {
                        last.text = Array(rule.utf8)
                    } else {
                        let rule = writer.addRule("\(name)-\(repeatedRules.count + 1)",
                                                  String(decoding: last.text, as: UTF8.self))
                        repeatedRules[last.text] = rule
                        last.text = Array(rule.utf8)
                    }
                }
                let repeated = GrammarWriter.repetition(String(decoding: last.rule, as: UTF8.self), min: minimum,
                                                        max: maximum)
                items.append(Item(text: Array(repeated.utf8), isLiteral: false))
            default:
                items.append(Item(text: try literal(), isLiteral: true))
            }
        }
        return Self.joined(items)
    }

    private static func joined(_ items: [Item]) -> [UInt8] {
        var rules: [[UInt8]] = []
        var literal: [UInt8] = []
        for item in items {
            if item.isLiteral {
                literal += item.text
                continue
            }
            if !literal.isEmpty { rules.append(Item(text: literal, isLiteral: true).rule) }
            literal = []
            rules.append(item.text)
        }
        if !literal.isEmpty { rules.append(Item(text: literal, isLiteral: true).rule) }
        return Array(rules.joined(separator: [UInt8(ascii: " ")]))
    }

    /// `[...]` as written; its escapes must be ones GBNF reads the same way.
    private mutating func characterClass() throws(PatternFailure) -> [UInt8] {
        var text = [UInt8(ascii: "[")]
        position += 1
        while position < pattern.count && pattern[position] != UInt8(ascii: "]") {
            if pattern[position] == UInt8(ascii: "\\") {
                let length = escapeLength(at: position)
                guard length > 0 else {
                    throw .unsupported("unsupported escape in character class: " + excerpt(position..<position + 2))
                }
                text += pattern[position..<position + length]
                position += length
            } else {
                text.append(pattern[position])
                position += 1
            }
        }
        guard position < pattern.count else { throw .invalid("unterminated character class") }
        position += 1
        return text + [UInt8(ascii: "]")]
    }

    /// `{n}`, `{m,}`, `{,n}` or `{m,n}`, numbers read as `std::stoi` reads them; `unbounded` for no maximum.
    private mutating func repetitionBounds() throws(PatternFailure) -> (Int, Int) {
        position += 1
        let start = position
        while position < pattern.count && pattern[position] != UInt8(ascii: "}") { position += 1 }
        guard position < pattern.count else { throw .unsupported("unterminated curly brackets") }
        let numbers = pattern[start..<position].split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false)
        position += 1
        guard numbers.count == 1 || numbers.count == 2 else {
            throw .unsupported("wrong number of values in curly brackets")
        }
        if numbers.count == 1 {
            guard let count = Self.integer(numbers[0]) else { throw .unsupported("invalid number in curly brackets") }
            return (count, count)
        }
        var bounds = (0, unbounded)
        if !numbers[0].isEmpty {
            guard let minimum = Self.integer(numbers[0]) else { throw .unsupported("invalid number in curly brackets") }
            bounds.0 = minimum
        }
        if !numbers[1].isEmpty {
            guard let maximum = Self.integer(numbers[1]) else { throw .unsupported("invalid number in curly brackets") }
            bounds.1 = maximum
        }
        return bounds
    }

    /// `std::stoi`: leading white space, a sign, at least one digit, anything after them ignored; nil where it
    /// throws (no digit, or outside `Int32`).
    private static func integer(_ text: ArraySlice<UInt8>) -> Int? {
        var rest = text.drop { [0x20, 0x09, 0x0A, 0x0B, 0x0C, 0x0D].contains($0) }
        var sign = 1
        if let first = rest.first, first == UInt8(ascii: "+") || first == UInt8(ascii: "-") {
            sign = first == UInt8(ascii: "-") ? -1 : 1
            rest = rest.dropFirst()
        }
        let digits = rest.prefix { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
        guard !digits.isEmpty, let magnitude = Int(String(decoding: digits, as: UTF8.self)),
              let value = Int32(exactly: sign * magnitude) else { return nil }
        return Int(value)
    }

    /// A run of literal characters. A character just before an operator is left to a literal of its own, so that a
    /// quantifier applies to it alone.
    private mutating func literal() throws(PatternFailure) -> [UInt8] {
        var literal: [UInt8] = []
        while position < pattern.count {
            let current = pattern[position]
            if current == UInt8(ascii: "\\") {
                guard position + 1 < pattern.count else { throw .invalid("trailing backslash") }
                let next = pattern[position + 1]
                if Self.operators.contains(next) {
                    literal.append(next)
                    position += 2
                } else {
                    let length = escapeLength(at: position)
                    guard length > 0 else { throw .unsupported("unsupported escape: " + excerpt(position..<position + 2)) }
                    literal += pattern[position..<position + length]
                    position += length
                }
            } else if current == UInt8(ascii: "\"") {
                literal += Array(#"\""#.utf8)
                position += 1
            } else if !Self.operators.contains(current)
                        && (position == pattern.count - 1 || literal.isEmpty || pattern[position + 1] == UInt8(ascii: ".")
                            || !Self.operators.contains(pattern[position + 1])) {
                literal.append(current)
                position += 1
            } else {
                break
            }
        }
        // Nothing was taken: a stray "]" or "}".
        guard !literal.isEmpty else { throw .unsupported("unsupported character: " + excerpt(position..<position + 1)) }
        return literal
    }

    /// The length of the escape at `index` when GBNF reads it as the regular expression does (`\n`, `\-`, `\x41`,
    /// `\u00e9`, ...), else 0.
    private func escapeLength(at index: Int) -> Int {
        guard index + 1 < pattern.count, pattern[index] == UInt8(ascii: "\\") else { return 0 }
        let hexDigits: Int
        switch pattern[index + 1] {
        case UInt8(ascii: "x"): hexDigits = 2
        case UInt8(ascii: "u"): hexDigits = 4
        case UInt8(ascii: "U"): hexDigits = 8
        case UInt8(ascii: "t"), UInt8(ascii: "r"), UInt8(ascii: "n"), UInt8(ascii: "\\"), UInt8(ascii: "\""),
             UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "-"):
            return 2
        default: return 0
        }
        guard index + 2 + hexDigits <= pattern.count,
              pattern[index + 2..<index + 2 + hexDigits].allSatisfy({ Character(UnicodeScalar($0)).isHexDigit })
        else { return 0 }
        return 2 + hexDigits
    }

    private func excerpt(_ range: Range<Int>) -> String {
        String(decoding: pattern[range.clamped(to: 0..<pattern.count)], as: UTF8.self)
    }
}

/// The characters of a set of strings, shared prefixes once.
private struct CharacterTrie {
    struct Node {
        var children: [Unicode.Scalar: Int] = [:]
        var isWord = false
    }

    var nodes = [Node()]

    mutating func insert(_ word: String) {
        var node = 0
        for scalar in word.unicodeScalars {
            if let child = nodes[node].children[scalar] {
                node = child
            } else {
                nodes.append(Node())
                nodes[node].children[scalar] = nodes.count - 1
                node = nodes.count - 1
            }
        }
        nodes[node].isWord = true
    }
}

/// llama.cpp's `build_min_max_int`: the digits of the integers from `minimum` to `maximum` (`Int64.min` and
/// `Int64.max`: no bound) as GBNF, with at most 16 digits where a side is unbounded. Arithmetic wraps as it does there.
private struct IntegerRange {
    var text = ""

    struct NoBound: Error {}

    mutating func write(minimum: Int64, maximum: Int64, decimalsLeft: Int = 16, topLevel: Bool = true) throws(NoBound) {
        var minimum = minimum
        let hasMinimum = minimum != .min
        let hasMaximum = maximum != .max
        if hasMinimum && hasMaximum {
            if minimum < 0 && maximum < 0 {
                text += #""-" ("#
                try write(minimum: 0 &- maximum, maximum: 0 &- minimum, decimalsLeft: decimalsLeft)
                text += ")"
                return
            }
            if minimum < 0 {
                text += #""-" ("#
                try write(minimum: 0, maximum: 0 &- minimum, decimalsLeft: decimalsLeft)
                text += ") | "
                minimum = 0
            }
            var low = Array(String(minimum).utf8)
            let high = Array(String(maximum).utf8)
            var digits = low.count
            while digits < high.count {
                uniformRange(low[...], Self.repeated("9", digits)[...])
                low = Array(("1" + String(repeating: "0", count: digits)).utf8)
                text += " | "
                digits += 1
            }
            uniformRange(low[...], high[...])
            return
        }

        let lessDecimals = max(decimalsLeft - 1, 1)
        if hasMinimum {
            if minimum < 0 {
                text += #""-" ("#
                try write(minimum: .min, maximum: 0 &- minimum, decimalsLeft: decimalsLeft, topLevel: false)
                text += ") | [0] | [1-9] "
                moreDigits(0, decimalsLeft - 1)
            } else if minimum == 0 {
                if topLevel {
                    text += "[0] | [1-9] "
                    moreDigits(0, lessDecimals)
                } else {
                    moreDigits(1, decimalsLeft)
                }
            } else if minimum <= 9 {
                let digit = Int(UInt8(ascii: "0")) + Int(minimum)
                let rangeStart = Int(UInt8(ascii: topLevel ? "1" : "0"))
                if digit > rangeStart {
                    digitRange(rangeStart, digit - 1)
                    text += " "
                    moreDigits(1, lessDecimals)
                    text += " | "
                }
                digitRange(digit, Int(UInt8(ascii: "9")))
                text += " "
                moreDigits(0, lessDecimals)
            } else {
                let low = Array(String(minimum).utf8)
                let first = Int(low[0])
                if first > Int(UInt8(ascii: "1")) {
                    digitRange(Int(UInt8(ascii: topLevel ? "1" : "0")), first - 1)
                    text += " "
                    moreDigits(low.count, lessDecimals)
                    text += " | "
                }
                digitRange(first, first)
                text += " ("
                let rest = Int64(String(decoding: low.dropFirst(), as: UTF8.self)) ?? 0
                try write(minimum: rest, maximum: .max, decimalsLeft: lessDecimals, topLevel: false)
                text += ")"
                if first < Int(UInt8(ascii: "9")) {
                    text += " | "
                    digitRange(first + 1, Int(UInt8(ascii: "9")))
                    text += " "
                    moreDigits(low.count - 1, lessDecimals)
                }
            }
            return
        }
        if hasMaximum {
            if maximum >= 0 {
                if topLevel {
                    text += #""-" [1-9] "#
                    moreDigits(0, lessDecimals)
                    text += " | "
                }
                try write(minimum: 0, maximum: maximum, decimalsLeft: decimalsLeft)
            } else {
                text += #""-" ("#
                try write(minimum: 0 &- maximum, maximum: .max, decimalsLeft: decimalsLeft, topLevel: false)
                text += ")"
            }
            return
        }
        throw NoBound()
    }

    private static func repeated(_ digit: Character, _ count: Int) -> [UInt8] {
        Array(String(repeating: digit, count: max(count, 0)).utf8)
    }

    private mutating func append(_ byte: Int) {
        text.unicodeScalars.append(Unicode.Scalar(UInt8(truncatingIfNeeded: byte)))
    }

    private mutating func digitRange(_ from: Int, _ to: Int) {
        text += "["
        append(from)
        if from != to {
            text += "-"
            append(to)
        }
        text += "]"
    }

    private mutating func moreDigits(_ minimum: Int, _ maximum: Int) {
        text += "[0-9]"
        if minimum == maximum && minimum == 1 { return }
        text += "{\(minimum)" + (maximum != minimum ? ",\(maximum)" : "") + "}"
    }

    /// The numbers of `from.count` digits from `from` to `to`: their common prefix, then a digit range per position.
    private mutating func uniformRange(_ from: ArraySlice<UInt8>, _ to: ArraySlice<UInt8>) {
        let from = Array(from)
        let to = Array(to)
        var common = 0
        while common < from.count && common < to.count && from[common] == to[common] { common += 1 }
        if common > 0 { text += "\"" + String(decoding: from[..<common], as: UTF8.self) + "\"" }
        guard common < from.count && common < to.count else { return }
        if common > 0 { text += " " }
        let i = common
        let subLength = from.count - i - 1
        guard subLength > 0 else {
            text += "["
            append(Int(from[i]))
            text += "-"
            append(Int(to[i]))
            text += "]"
            return
        }
        let fromRest = from[(i + 1)...]
        let toRest = to[(i + 1)...]
        let zeros = Self.repeated("0", subLength)
        let nines = Self.repeated("9", subLength)
        var reachedTo = false
        text += "("
        if fromRest.elementsEqual(zeros) {
            digitRange(Int(from[i]), Int(to[i]) - 1)
            text += " "
            moreDigits(subLength, subLength)
        } else {
            text += "["
            append(Int(from[i]))
            text += "] ("
            uniformRange(fromRest, nines[...])
            text += ")"
            if Int(from[i]) < Int(to[i]) - 1 {
                text += " | "
                if toRest.elementsEqual(nines) {
                    digitRange(Int(from[i]) + 1, Int(to[i]))
                    reachedTo = true
                } else {
                    digitRange(Int(from[i]) + 1, Int(to[i]) - 1)
                }
                text += " "
                moreDigits(subLength, subLength)
            }
        }
        if !reachedTo {
            text += " | "
            digitRange(Int(to[i]), Int(to[i]))
            text += " "
            uniformRange(zeros[...], toRest)
        }
        text += ")"
    }
}

fileprivate extension JSONValue {
    /// The value as nlohmann's `dump()` writes it, which is what llama.cpp quotes for `const` and `enum`: no spaces,
    /// keys in order, only `"`, `\` and control characters escaped, doubles in its `%g`-like layout.
    var compactText: String {
        switch self {
        case .null: return "null"
        case let .bool(value): return value ? "true" : "false"
        case let .int(value): return String(value)
        case let .double(value): return Self.nlohmannText(value)
        case let .string(value): return Self.quoted(value)
        case let .array(elements): return "[" + elements.map(\.compactText).joined(separator: ",") + "]"
        case let .object(members):
            return "{" + members.map { Self.quoted($0.0) + ":" + $0.1.compactText }.joined(separator: ",") + "}"
        }
    }

    private static func quoted(_ text: String) -> String {
        var quoted = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": quoted += #"\""#
            case "\\": quoted += #"\\"#
            case "\u{08}": quoted += #"\b"#
            case "\u{0C}": quoted += #"\f"#
            case "\n": quoted += #"\n"#
            case "\r": quoted += #"\r"#
            case "\t": quoted += #"\t"#
            case "\u{00}"..."\u{1F}":
                let hex = String(scalar.value, radix: 16)
                quoted += #"\u"# + String(repeating: "0", count: 4 - hex.count) + hex
            default: quoted.unicodeScalars.append(scalar)
            }
        }
        return quoted + "\""
    }

    /// nlohmann's layout of a double: its Grisu2 digits (`Grisu2`) in fixed-point from 1e-4 up to 1e15 with at least
    /// one decimal ("100.0"), otherwise as "1e+100" or "1.5e-05".
    private static func nlohmannText(_ value: Double) -> String {
        guard value.isFinite else { return "null" }
        let sign = value.sign == .minus ? "-" : ""
        if value == 0 { return sign + "0.0" }
        let (digits, exponent) = Grisu2.digits(value.magnitude)
        let count = digits.count
        // The value is 0.digits × 10^point.
        let point = count + exponent
        let text = String(decoding: digits, as: UTF8.self)
        if count <= point && point <= 15 {
            return sign + text + String(repeating: "0", count: point - count) + ".0"
        }
        if 0 < point && point <= 15 {
            return sign + text.prefix(point) + "." + text.dropFirst(point)
        }
        if -4 < point && point <= 0 {
            return sign + "0." + String(repeating: "0", count: -point) + text
        }
        let scale = point - 1
        let exponentDigits = String(abs(scale))
        return sign + text.prefix(1) + (count > 1 ? "." + text.dropFirst() : "") + "e" + (scale < 0 ? "-" : "+")
            + (exponentDigits.count < 2 ? "0" : "") + exponentDigits
    }
}

/// The decimal digits nlohmann's serializer writes for a double: Grisu2 (Loitsch, "Printing Floating-Point Numbers
/// Quickly and Accurately with Integers", 2010) with nlohmann's parameters. They read back as the same double but are
/// not always the shortest or the closest such digits (about 2% of doubles with 16 or 17 significant digits differ
/// from Swift's `description` in their last digit or two), so they are computed the same way here.
private enum Grisu2 {
    /// `significand` × 2^`exponent`.
    private struct BinaryFloat {
        var significand: UInt64
        var exponent: Int

        /// The product rounded to 64 bits, halves up.
        func times(_ other: BinaryFloat) -> BinaryFloat {
            let (high, low) = significand.multipliedFullWidth(by: other.significand)
            return BinaryFloat(significand: high + (low >> 63), exponent: exponent + other.exponent + 64)
        }

        var normalized: BinaryFloat {
            let shift = significand.leadingZeroBitCount
            return BinaryFloat(significand: significand << shift, exponent: exponent - shift)
        }
    }

    /// 10^k for k = -300, -292, ..., 324, each the 64-bit significand nearest to it with its binary exponent.
    private static let cachedPowers: [(significand: UInt64, exponent: Int)] = [
        (0xAB70FE17C79AC6CA, -1060), (0xFF77B1FCBEBCDC4F, -1034), (0xBE5691EF416BD60C, -1007),
        (0x8DD01FAD907FFC3C, -980), (0xD3515C2831559A83, -954), (0x9D71AC8FADA6C9B5, -927),
        (0xEA9C227723EE8BCB, -901), (0xAECC49914078536D, -874), (0x823C12795DB6CE57, -847),
        (0xC21094364DFB5637, -821), (0x9096EA6F3848984F, -794), (0xD77485CB25823AC7, -768),
        (0xA086CFCD97BF97F4, -741), (0xEF340A98172AACE5, -715), (0xB23867FB2A35B28E, -688),
        (0x84C8D4DFD2C63F3B, -661), (0xC5DD44271AD3CDBA, -635), (0x936B9FCEBB25C996, -608),
        (0xDBAC6C247D62A584, -582), (0xA3AB66580D5FDAF6, -555), (0xF3E2F893DEC3F126, -529),
        (0xB5B5ADA8AAFF80B8, -502), (0x87625F056C7C4A8B, -475), (0xC9BCFF6034C13053, -449),
        (0x964E858C91BA2655, -422), (0xDFF9772470297EBD, -396), (0xA6DFBD9FB8E5B88F, -369),
        (0xF8A95FCF88747D94, -343), (0xB94470938FA89BCF, -316), (0x8A08F0F8BF0F156B, -289),
        (0xCDB02555653131B6, -263), (0x993FE2C6D07B7FAC, -236), (0xE45C10C42A2B3B06, -210),
        (0xAA242499697392D3, -183), (0xFD87B5F28300CA0E, -157), (0xBCE5086492111AEB, -130),
        (0x8CBCCC096F5088CC, -103), (0xD1B71758E219652C, -77), (0x9C40000000000000, -50),
        (0xE8D4A51000000000, -24), (0xAD78EBC5AC620000, 3), (0x813F3978F8940984, 30),
        (0xC097CE7BC90715B3, 56), (0x8F7E32CE7BEA5C70, 83), (0xD5D238A4ABE98068, 109),
        (0x9F4F2726179A2245, 136), (0xED63A231D4C4FB27, 162), (0xB0DE65388CC8ADA8, 189),
        (0x83C7088E1AAB65DB, 216), (0xC45D1DF942711D9A, 242), (0x924D692CA61BE758, 269),
        (0xDA01EE641A708DEA, 295), (0xA26DA3999AEF774A, 322), (0xF209787BB47D6B85, 348),
        (0xB454E4A179DD1877, 375), (0x865B86925B9BC5C2, 402), (0xC83553C5C8965D3D, 428),
        (0x952AB45CFA97A0B3, 455), (0xDE469FBD99A05FE3, 481), (0xA59BC234DB398C25, 508),
        (0xF6C69A72A3989F5C, 534), (0xB7DCBF5354E9BECE, 561), (0x88FCF317F22241E2, 588),
        (0xCC20CE9BD35C78A5, 614), (0x98165AF37B2153DF, 641), (0xE2A0B5DC971F303A, 667),
        (0xA8D9D1535CE3B396, 694), (0xFB9B7CD9A4A7443C, 720), (0xBB764C4CA7A44410, 747),
        (0x8BAB8EEFB6409C1A, 774), (0xD01FEF10A657842C, 800), (0x9B10A4E5E9913129, 827),
        (0xE7109BFBA19C0C9D, 853), (0xAC2820D9623BF429, 880), (0x80444B5E7AA7CF85, 907),
        (0xBF21E44003ACDD2D, 933), (0x8E679C2F5E44FF8F, 960), (0xD433179D9C8CB841, 986),
        (0x9E19DB92B4E31BA9, 1013),
    ]

    /// The digits (ASCII) of a positive finite `value` and the power of ten they are scaled by.
    static func digits(_ value: Double) -> (digits: [UInt8], exponent: Int) {
        // The neighbours' midpoints bound the numbers that read back as `value`.
        let bits = value.bitPattern
        let biasedExponent = Int(bits >> 52)
        let fraction = bits & (1 << 52 - 1)
        let exact = biasedExponent == 0 ? BinaryFloat(significand: fraction, exponent: -1074)
            : BinaryFloat(significand: fraction | 1 << 52, exponent: biasedExponent - 1075)
        let upper = BinaryFloat(significand: 2 * exact.significand + 1, exponent: exact.exponent - 1).normalized
        let lowerIsCloser = fraction == 0 && biasedExponent > 1
        let lowerRaw = lowerIsCloser ? BinaryFloat(significand: 4 * exact.significand - 1, exponent: exact.exponent - 2)
            : BinaryFloat(significand: 2 * exact.significand - 1, exponent: exact.exponent - 1)
        let lower = BinaryFloat(significand: lowerRaw.significand << (lowerRaw.exponent - upper.exponent),
                                exponent: upper.exponent)

        // A cached power that brings the upper bound's exponent into [-60, -32].
        let target = -60 - upper.exponent - 1
        let k = target * 78913 / (1 << 18) + (target > 0 ? 1 : 0)
        let index = (300 + k + 7) / 8
        let power = BinaryFloat(significand: cachedPowers[index].significand, exponent: cachedPowers[index].exponent)
        let scaled = exact.normalized.times(power)
        let scaledLower = lower.times(power)
        let scaledUpper = upper.times(power)
        // The products are off by up to one unit: keep to the interval they surely bound.
        let low = scaledLower.significand + 1
        let high = BinaryFloat(significand: scaledUpper.significand - 1, exponent: scaledUpper.exponent)
        var exponent = 300 - 8 * index
        var digits: [UInt8] = []

        let shift = UInt64(-high.exponent)
        let one = UInt64(1) << shift
        var integral = UInt32(high.significand >> shift)
        var fractional = high.significand & (one - 1)
        var delta = high.significand - low
        var distance = high.significand - scaled.significand

        var power10: UInt32 = 1
        var remaining = 1
        while power10 <= integral / 10 {
            power10 *= 10
            remaining += 1
        }
        while remaining > 0 {
            digits.append(UInt8(ascii: "0") + UInt8(integral / power10))
            integral %= power10
            remaining -= 1
            let rest = UInt64(integral) << shift + fractional
            if rest <= delta {
                exponent += remaining
                round(&digits, distance: distance, delta: delta, rest: rest, unit: UInt64(power10) << shift)
                return (digits, exponent)
            }
            power10 /= 10
        }
        repeat {
            fractional &*= 10
            digits.append(UInt8(ascii: "0") + UInt8(fractional >> shift))
            fractional &= one - 1
            delta &*= 10
            distance &*= 10
            exponent -= 1
        } while fractional > delta
        round(&digits, distance: distance, delta: delta, rest: fractional, unit: one)
        return (digits, exponent)
    }

    /// Moves the last digit down while that brings the number closer to the value and keeps it in the interval.
    private static func round(_ digits: inout [UInt8], distance: UInt64, delta: UInt64, rest: UInt64, unit: UInt64) {
        var rest = rest
        while rest < distance && delta - rest >= unit
                && (rest + unit < distance || distance - rest > rest + unit - distance) {
            digits[digits.count - 1] -= 1
            rest += unit
        }
    }
}

extension Grammar {
    /// A GBNF literal of `text`: quotes, backslashes, CR and LF escaped.
    static func literal(_ text: String) -> String {
        var escaped = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\r": escaped += #"\r"#
            case "\n": escaped += #"\n"#
            case "\"": escaped += #"\""#
            case "\\": escaped += #"\\"#
            default: escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped + "\""
    }
}
