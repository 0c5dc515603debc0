/// One top-level argument of a call in a C++ test source.
enum CppArgument: Equatable {
    /// One or more adjacent string literals, concatenated, escapes decoded (raw strings taken as written).
    case string(String)
    /// A lone name: `SUCCESS`, `nullptr`, a variable.
    case identifier(String)
    /// A braced initializer, `{ ... }`, with its elements.
    case list([CppArgument])
    /// Anything else (`token(10) + "x"`, `42`), as its source text.
    case expression(String)
}

/// Reads the cases of llama.cpp's C++ test suites as they are written (`test({ SUCCESS, "name", R"""(...)""", ... })`),
/// so that the Swift tests run the suites themselves instead of copies that could drift from them.
///
/// It is a tokenizer, not a C++ parser: it knows comments, string and character literals (prefixes and raw strings
/// included), preprocessor lines and bracket nesting, which is all the suites' call sites need.
enum CppTestSource {
    /// The top-level arguments of every call `name(...)` whose first argument is a string literal or a braced list:
    /// the test cases, not the function's own definition (`static void test(const std::string & ...)`) or its
    /// forwarding calls (`test(desc + ". Grammar: " + grammar, ...)`).
    static func calls(named name: String, in source: String) -> [[CppArgument]] {
        let source = Array(source.utf8)
        var lexer = CppLexer(source: source)
        let tokens = lexer.tokens()
        var calls: [[CppArgument]] = []
        for index in tokens.indices where tokens[index].kind == .identifier(name) {
            guard index + 1 < tokens.count, tokens[index + 1].kind == .punctuation(UInt8(ascii: "(")) else { continue }
            let arguments = CppArguments(source: source, tokens: tokens).split(from: index + 2,
                                                                               closing: UInt8(ascii: ")"))
            switch arguments.first {
            case .string, .list: calls.append(arguments)
            default: continue
            }
        }
        return calls
    }
}

private struct CppToken {
    enum Kind: Equatable {
        /// Its bytes, escapes decoded: adjacent literals are joined before they are read as UTF-8.
        case string([UInt8])
        case identifier(String)
        case punctuation(UInt8)
        /// A number or a character literal.
        case other
    }

    var kind: Kind
    /// Where it is in the source, in bytes.
    var range: Range<Int>
}

private struct CppLexer {
    let source: [UInt8]
    private var position = 0

    init(source: [UInt8]) { self.source = source }

    private func byte(at offset: Int) -> UInt8? { offset < source.count ? source[offset] : nil }

    private static func isIdentifierByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), 0x80...: true
        default: false
        }
    }

    mutating func tokens() -> [CppToken] {
        var tokens: [CppToken] = []
        var atLineStart = true
        while let current = byte(at: position) {
            let start = position
            switch current {
            case UInt8(ascii: "\n"):
                atLineStart = true
                position += 1
                continue
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\r"), 0x0B, 0x0C:
                position += 1
                continue
            case UInt8(ascii: "/") where byte(at: position + 1) == UInt8(ascii: "/"):
                skipLine()
                continue
            case UInt8(ascii: "/") where byte(at: position + 1) == UInt8(ascii: "*"):
                position += 2
                while position < source.count,
                      !(source[position] == UInt8(ascii: "*") && byte(at: position + 1) == UInt8(ascii: "/")) {
                    position += 1
                }
                position = min(position + 2, source.count)
                continue
            case UInt8(ascii: "#") where atLineStart:
                skipLine()
                continue
            case UInt8(ascii: "\""):
                tokens.append(CppToken(kind: .string(quoted()), range: start..<position))
            case UInt8(ascii: "'"):
                skipCharacterLiteral()
                tokens.append(CppToken(kind: .other, range: start..<position))
            case UInt8(ascii: "0")...UInt8(ascii: "9"):
                // Digit separators (1'000) and exponent signs (1e-5) stay inside the number.
                position += 1
                while let next = byte(at: position) {
                    if Self.isIdentifierByte(next) || next == UInt8(ascii: ".") || next == UInt8(ascii: "'") {
                        position += 1
                    } else if next == UInt8(ascii: "+") || next == UInt8(ascii: "-"),
                              let previous = byte(at: position - 1), Array("eEpP".utf8).contains(previous) {
                        position += 1
                    } else {
                        break
                    }
                }
                tokens.append(CppToken(kind: .other, range: start..<position))
            case _ where Self.isIdentifierByte(current):
                while let next = byte(at: position), Self.isIdentifierByte(next) { position += 1 }
                let word = String(decoding: source[start..<position], as: UTF8.self)
                let prefixes: Set<String> = ["u8", "u", "U", "L"]
                let isRaw = word == "R" || word.hasSuffix("R") && prefixes.contains(String(word.dropLast()))
                if byte(at: position) == UInt8(ascii: "\"") && (isRaw || prefixes.contains(word)) {
                    tokens.append(CppToken(kind: .string(isRaw ? raw() : quoted()), range: start..<position))
                } else if byte(at: position) == UInt8(ascii: "'") && prefixes.contains(word) {
                    skipCharacterLiteral()
                    tokens.append(CppToken(kind: .other, range: start..<position))
                } else {
                    tokens.append(CppToken(kind: .identifier(word), range: start..<position))
                }
            default:
                position += 1
                tokens.append(CppToken(kind: .punctuation(current), range: start..<position))
            }
            atLineStart = false
        }
        return tokens
    }

    /// To the end of the line, continuation lines (a trailing backslash) included.
    private mutating func skipLine() {
        while let current = byte(at: position), current != UInt8(ascii: "\n") {
            position += current == UInt8(ascii: "\\") && byte(at: position + 1) == UInt8(ascii: "\n") ? 2 : 1
        }
    }

    private mutating func skipCharacterLiteral() {
        position += 1
        while let current = byte(at: position), current != UInt8(ascii: "'"), current != UInt8(ascii: "\n") {
            position += current == UInt8(ascii: "\\") ? 2 : 1
        }
        position = min(position + 1, source.count)
    }

    /// `R"delim( ... )delim"`, at the opening quote.
    private mutating func raw() -> [UInt8] {
        position += 1
        let delimiterStart = position
        while let current = byte(at: position), current != UInt8(ascii: "(") { position += 1 }
        let terminator = [UInt8(ascii: ")")] + source[delimiterStart..<position] + [UInt8(ascii: "\"")]
        position += 1
        let contentStart = min(position, source.count)
        while position < source.count && !source[position...].starts(with: terminator) { position += 1 }
        let content = Array(source[contentStart..<min(position, source.count)])
        position = min(position + terminator.count, source.count)
        return content
    }

    /// `"..."`, at the opening quote, escapes decoded: `\x` and octal escapes are bytes, `\u` and `\U` code points.
    private mutating func quoted() -> [UInt8] {
        position += 1
        var bytes: [UInt8] = []
        while let current = byte(at: position), current != UInt8(ascii: "\""), current != UInt8(ascii: "\n") {
            position += 1
            guard current == UInt8(ascii: "\\"), let escape = byte(at: position) else {
                bytes.append(current)
                continue
            }
            position += 1
            switch escape {
            case UInt8(ascii: "n"): bytes.append(0x0A)
            case UInt8(ascii: "t"): bytes.append(0x09)
            case UInt8(ascii: "r"): bytes.append(0x0D)
            case UInt8(ascii: "a"): bytes.append(0x07)
            case UInt8(ascii: "b"): bytes.append(0x08)
            case UInt8(ascii: "f"): bytes.append(0x0C)
            case UInt8(ascii: "v"): bytes.append(0x0B)
            case UInt8(ascii: "x"):
                bytes.append(UInt8(truncatingIfNeeded: digits(radix: 16, limit: .max)))
            case UInt8(ascii: "0")...UInt8(ascii: "7"):
                position -= 1
                bytes.append(UInt8(truncatingIfNeeded: digits(radix: 8, limit: 3)))
            case UInt8(ascii: "u"), UInt8(ascii: "U"):
                let scalar = Unicode.Scalar(UInt32(digits(radix: 16, limit: escape == UInt8(ascii: "u") ? 4 : 8)))
                bytes += Array(String(Character(scalar ?? "\u{FFFD}")).utf8)
            case UInt8(ascii: "\n"):
                continue
            default:
                // \" \\ \' \? stand for themselves.
                bytes.append(escape)
            }
        }
        position = min(position + 1, source.count)
        return bytes
    }

    private mutating func digits(radix: Int, limit: Int) -> Int {
        var value = 0
        var count = 0
        while count < limit, let current = byte(at: position),
              let digit = Character(UnicodeScalar(current)).hexDigitValue, digit < radix {
            value = value &* radix &+ digit
            position += 1
            count += 1
        }
        return value
    }
}

private struct CppArguments {
    let source: [UInt8]
    let tokens: [CppToken]

    /// The comma-separated arguments from `start` up to the bracket `closing` that ends them (or the end of the
    /// source); an empty last element (a trailing comma in a braced list) is dropped.
    func split(from start: Int, closing: UInt8) -> [CppArgument] {
        var arguments: [CppArgument] = []
        var depth = 0
        var argumentStart = start
        var index = start
        while index < tokens.count {
            if case let .punctuation(byte) = tokens[index].kind {
                switch byte {
                case UInt8(ascii: "("), UInt8(ascii: "["), UInt8(ascii: "{"): depth += 1
                case UInt8(ascii: ")"), UInt8(ascii: "]"), UInt8(ascii: "}"):
                    if depth == 0 {
                        if byte == closing, argumentStart < index { arguments.append(argument(argumentStart..<index)) }
                        return arguments
                    }
                    depth -= 1
                case UInt8(ascii: ",") where depth == 0:
                    arguments.append(argument(argumentStart..<index))
                    argumentStart = index + 1
                default: break
                }
            }
            index += 1
        }
        if argumentStart < index { arguments.append(argument(argumentStart..<index)) }
        return arguments
    }

    private func argument(_ range: Range<Int>) -> CppArgument {
        let slice = tokens[range]
        var bytes: [UInt8] = []
        var literals = 0
        for token in slice {
            guard case let .string(text) = token.kind else { break }
            bytes += text
            literals += 1
        }
        if !slice.isEmpty && literals == slice.count { return .string(String(decoding: bytes, as: UTF8.self)) }
        if slice.count == 1, case let .identifier(name) = slice[range.lowerBound].kind { return .identifier(name) }
        if slice.first?.kind == .punctuation(UInt8(ascii: "{")),
           closingBrace(from: range.lowerBound) == range.upperBound - 1 {
            return .list(split(from: range.lowerBound + 1, closing: UInt8(ascii: "}")))
        }
        guard let first = slice.first, let last = slice.last else { return .expression("") }
        return .expression(String(decoding: source[first.range.lowerBound..<last.range.upperBound], as: UTF8.self))
    }

    /// The index of the bracket that closes the one at `open`.
    private func closingBrace(from open: Int) -> Int? {
        var depth = 0
        for index in open..<tokens.count {
            guard case let .punctuation(byte) = tokens[index].kind else { continue }
            switch byte {
            case UInt8(ascii: "("), UInt8(ascii: "["), UInt8(ascii: "{"): depth += 1
            case UInt8(ascii: ")"), UInt8(ascii: "]"), UInt8(ascii: "}"):
                depth -= 1
                if depth == 0 { return index }
            default: break
            }
        }
        return nil
    }
}
