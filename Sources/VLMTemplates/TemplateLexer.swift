/// One token of a template, as jinja2's lexer produces it (comments and whitespace inside tags dropped).
struct TemplateToken: Sendable {
    enum Kind: Sendable, Equatable {
        case data(String)
        case variableBegin, variableEnd, blockBegin, blockEnd
        case name(String)
        case string(String)
        case integer(Int)
        case float(Double)
        case op(String)
        case end
    }

    let kind: Kind
    /// Offset in the normalized source's Unicode scalars.
    let offset: Int
}

/// Python's `str.isspace`, which jinja2's `\s` and `rstrip` follow.
func isPythonWhitespace(_ scalar: Unicode.Scalar) -> Bool {
    switch scalar.value {
    case 0x09...0x0D, 0x1C...0x20, 0x85, 0xA0, 0x1680, 0x2000...0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
        true
    default: false
    }
}

/// Splits a template into tokens with jinja2's rules as transformers configures them: `trim_blocks` (drop the first
/// newline after a block or comment tag), `lstrip_blocks` (drop spaces and tabs between a line start and a block or
/// comment tag), `-` and `+` whitespace control, and one trailing newline of the source removed.
struct TemplateLexer {
    let source: [Unicode.Scalar]
    let file: String
    private var tokens: [TemplateToken] = []
    private var position = 0
    private var lineStarting = true

    /// Normalizes newlines to `\n` and drops one trailing newline, as jinja2 does before lexing.
    static func normalize(_ text: String) -> [Unicode.Scalar] {
        var scalars: [Unicode.Scalar] = []
        scalars.reserveCapacity(text.unicodeScalars.count)
        var previousWasCR = false
        for scalar in text.unicodeScalars {
            if scalar == "\r" {
                scalars.append("\n")
                previousWasCR = true
                continue
            }
            if scalar == "\n", previousWasCR {
                previousWasCR = false
                continue
            }
            previousWasCR = false
            scalars.append(scalar)
        }
        if scalars.last == "\n" { scalars.removeLast() }
        return scalars
    }

    init(source: [Unicode.Scalar], file: String) {
        self.source = source
        self.file = file
    }

    func location(of offset: Int) -> (line: Int, column: Int) {
        var line = 1
        var column = 1
        for scalar in source[..<min(offset, source.count)] {
            if scalar == "\n" {
                line += 1
                column = 1
            } else {
                column += 1
            }
        }
        return (line, column)
    }

    private func syntaxError(_ message: String, at offset: Int) -> ChatTemplateError {
        let (line, column) = location(of: offset)
        return .syntax(file: file, line: line, column: column, message: message)
    }

    private func matches(_ text: String, at offset: Int) -> Bool {
        var index = offset
        for scalar in text.unicodeScalars {
            guard index < source.count, source[index] == scalar else { return false }
            index += 1
        }
        return true
    }

    private func skipWhitespace(from offset: Int) -> Int {
        var index = offset
        while index < source.count, isPythonWhitespace(source[index]) { index += 1 }
        return index
    }

    mutating func tokenize() throws(ChatTemplateError) -> [TemplateToken] {
        while position < source.count {
            guard let (tagStart, opener) = nextTag(from: position) else {
                tokens.append(TemplateToken(kind: .data(String(String.UnicodeScalarView(source[position...]))), offset: position))
                position = source.count
                break
            }
            var afterOpener = tagStart + 2
            var sign: Unicode.Scalar?
            if afterOpener < source.count, source[afterOpener] == "-" || source[afterOpener] == "+" {
                sign = source[afterOpener]
                afterOpener += 1
            }
            let rawEnd = opener == "%" ? rawBeginEnd(after: afterOpener) : nil
            emitData(from: position, to: tagStart, sign: sign, stripsLeading: opener != "{")
            switch opener {
            case "#":
                try lexComment(bodyStart: afterOpener, tagStart: tagStart)
            case "%" where rawEnd != nil:
                try lexRaw(bodyStart: rawEnd!)
            default:
                try lexTag(isBlock: opener == "%", start: tagStart, bodyStart: afterOpener)
            }
        }
        tokens.append(TemplateToken(kind: .end, offset: source.count))
        return tokens
    }

    /// The earliest `{{`, `{%` or `{#` at or after `offset`, and its second character.
    private func nextTag(from offset: Int) -> (Int, Unicode.Scalar)? {
        var index = offset
        while index + 1 < source.count {
            if source[index] == "{" {
                let next = source[index + 1]
                if next == "{" || next == "%" || next == "#" { return (index, next) }
            }
            index += 1
        }
        return nil
    }

    /// Where the text of a `{% raw %}` block starts, if the tag at hand is one.
    private func rawBeginEnd(after offset: Int) -> Int? {
        var index = skipWhitespace(from: offset)
        guard matches("raw", at: index) else { return nil }
        index = skipWhitespace(from: index + 3)
        if matches("-%}", at: index) { return skipWhitespace(from: index + 3) }
        if matches("%}", at: index) { return index + 2 }
        return nil
    }

    /// Emits the text before a tag, applying `-` (strip all whitespace) or lstrip_blocks.
    private mutating func emitData(from start: Int, to end: Int, sign: Unicode.Scalar?, stripsLeading: Bool) {
        var stop = end
        if sign == "-" {
            while stop > start, isPythonWhitespace(source[stop - 1]) { stop -= 1 }
        } else if sign != "+", stripsLeading {
            var lineStart = end
            while lineStart > start, source[lineStart - 1] != "\n" { lineStart -= 1 }
            if lineStart > start || lineStarting, lineStart < end,
                source[lineStart..<end].allSatisfy(isPythonWhitespace)
            {
                stop = lineStart
            }
        }
        if stop > start {
            tokens.append(TemplateToken(kind: .data(String(String.UnicodeScalarView(source[start..<stop]))), offset: start))
        }
    }

    /// Consumes a tag's closing delimiter at `index` if there is one, with its whitespace control; returns the
    /// offset after it.
    private mutating func closeTag(at index: Int, delimiter: String, trims: Bool) -> Int? {
        var end: Int
        if trims, matches("+" + delimiter, at: index) {
            end = index + 3
        } else if matches("-" + delimiter, at: index) {
            end = skipWhitespace(from: index + 3)
        } else if matches(delimiter, at: index) {
            end = index + 2
            if trims, end < source.count, source[end] == "\n" { end += 1 }
        } else {
            return nil
        }
        lineStarting = source[end - 1] == "\n"
        return end
    }

    private mutating func lexComment(bodyStart: Int, tagStart: Int) throws(ChatTemplateError) {
        var index = bodyStart
        while index < source.count {
            if source[index] == "#", index + 1 < source.count, source[index + 1] == "}" {
                let closeStart = index > bodyStart && (source[index - 1] == "-" || source[index - 1] == "+") ? index - 1 : index
                position = closeTag(at: closeStart, delimiter: "#}", trims: true)!
                return
            }
            index += 1
        }
        throw syntaxError("missing end of comment tag", at: tagStart)
    }

    private mutating func lexRaw(bodyStart: Int) throws(ChatTemplateError) {
        var index = bodyStart
        while index < source.count {
            if matches("{%", at: index) {
                var inner = index + 2
                var sign: Unicode.Scalar?
                if inner < source.count, source[inner] == "-" || source[inner] == "+" {
                    sign = source[inner]
                    inner += 1
                }
                inner = skipWhitespace(from: inner)
                if matches("endraw", at: inner) {
                    inner = skipWhitespace(from: inner + 6)
                    if let end = closeTagPreview(at: inner) {
                        lineStarting = source[bodyStart - 1] == "\n"
                        emitData(from: bodyStart, to: index, sign: sign, stripsLeading: true)
                        position = closeTag(at: end, delimiter: "%}", trims: true)!
                        return
                    }
                }
            }
            index += 1
        }
        throw syntaxError("missing end of raw directive", at: bodyStart)
    }

    private func closeTagPreview(at index: Int) -> Int? {
        matches("+%}", at: index) || matches("-%}", at: index) || matches("%}", at: index) ? index : nil
    }

    private mutating func lexTag(isBlock: Bool, start: Int, bodyStart: Int) throws(ChatTemplateError) {
        tokens.append(TemplateToken(kind: isBlock ? .blockBegin : .variableBegin, offset: start))
        let delimiter = isBlock ? "%}" : "}}"
        var index = bodyStart
        var brackets: [Unicode.Scalar] = []
        while true {
            if brackets.isEmpty, let end = closeTag(at: index, delimiter: delimiter, trims: isBlock) {
                tokens.append(TemplateToken(kind: isBlock ? .blockEnd : .variableEnd, offset: index))
                position = end
                return
            }
            guard index < source.count else {
                throw syntaxError("unexpected end of template, expected '\(delimiter)'", at: start)
            }
            let scalar = source[index]
            if isPythonWhitespace(scalar) {
                index += 1
                continue
            }
            var lexed = try number(at: index)
            if lexed == nil { lexed = name(at: index) }
            if lexed == nil { lexed = try string(at: index) }
            if let (kind, end) = lexed {
                tokens.append(TemplateToken(kind: kind, offset: index))
                index = end
                continue
            }
            guard let op = op(at: index) else {
                throw syntaxError("unexpected character '\(scalar)'", at: index)
            }
            switch op {
            case "{": brackets.append("}")
            case "(": brackets.append(")")
            case "[": brackets.append("]")
            case "}", ")", "]":
                guard let expected = brackets.popLast() else { throw syntaxError("unexpected '\(op)'", at: index) }
                guard String(expected) == op else {
                    throw syntaxError("unexpected '\(op)', expected '\(expected)'", at: index)
                }
            default: break
            }
            tokens.append(TemplateToken(kind: .op(op), offset: index))
            index += op.unicodeScalars.count
        }
    }

    private static let operators = ["//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                    ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"]

    private func op(at index: Int) -> String? {
        Self.operators.first { matches($0, at: index) }
    }

    private func isDigit(_ index: Int) -> Bool {
        index < source.count && ("0"..."9").contains(source[index])
    }

    /// Digits with single underscores between them (`1_000`); returns the end, or nil if no digit is there.
    private func digitRun(at index: Int) -> Int? {
        guard isDigit(index) else { return nil }
        var end = index + 1
        while true {
            if isDigit(end) {
                end += 1
            } else if end < source.count, source[end] == "_", isDigit(end + 1) {
                end += 2
            } else {
                return end
            }
        }
    }

    private func number(at index: Int) throws(ChatTemplateError) -> (TemplateToken.Kind, Int)? {
        guard isDigit(index), index == 0 || source[index - 1] != "." else {
            guard isDigit(index) else { return nil }
            return try integer(at: index)
        }
        let integerEnd = digitRun(at: index)!
        var end = integerEnd
        var isFloat = false
        if end < source.count, source[end] == ".", let fractionEnd = digitRun(at: end + 1) {
            end = fractionEnd
            isFloat = true
        }
        if end < source.count, source[end] == "e" || source[end] == "E" {
            var exponent = end + 1
            if exponent < source.count, source[exponent] == "+" || source[exponent] == "-" { exponent += 1 }
            if let exponentEnd = digitRun(at: exponent) {
                end = exponentEnd
                isFloat = true
            }
        }
        guard isFloat else { return try integer(at: index) }
        let text = String(String.UnicodeScalarView(source[index..<end].filter { $0 != "_" }))
        guard let value = Double(text) else { throw syntaxError("invalid number '\(text)'", at: index) }
        return (.float(value), end)
    }

    private func integer(at index: Int) throws(ChatTemplateError) -> (TemplateToken.Kind, Int)? {
        if source[index] == "0", index + 1 < source.count {
            let radixMarker = source[index + 1].properties.lowercaseMapping
            let radix = radixMarker == "b" ? 2 : radixMarker == "o" ? 8 : radixMarker == "x" ? 16 : 0
            if radix != 0 {
                var end = index + 2
                var digits = ""
                while end < source.count {
                    if source[end] == "_", end + 1 < source.count, source[end + 1] != "_" {
                        end += 1
                        continue
                    }
                    guard let digit = Int(String(source[end]), radix: radix) else { break }
                    digits += String(digit, radix: radix)
                    end += 1
                }
                if !digits.isEmpty {
                    guard let value = Int(digits, radix: radix) else {
                        throw syntaxError("integer literal too large", at: index)
                    }
                    return (.integer(value), end)
                }
            }
            // "0", "00", "0_0": a decimal zero; other digits after a leading zero start a new token.
            var end = index + 1
            while end < source.count {
                if source[end] == "0" {
                    end += 1
                } else if source[end] == "_", end + 1 < source.count, source[end + 1] == "0" {
                    end += 2
                } else {
                    break
                }
            }
            return (.integer(0), end)
        }
        let end = digitRun(at: index)!
        let text = String(String.UnicodeScalarView(source[index..<end].filter { $0 != "_" }))
        guard let value = Int(text) else { throw syntaxError("integer literal too large", at: index) }
        return (.integer(value), end)
    }

    private func name(at index: Int) -> (TemplateToken.Kind, Int)? {
        let first = source[index]
        guard first == "_" || first.properties.isXIDStart else { return nil }
        var end = index + 1
        while end < source.count, source[end] == "_" || source[end].properties.isXIDContinue { end += 1 }
        return (.name(String(String.UnicodeScalarView(source[index..<end]))), end)
    }

    private func string(at index: Int) throws(ChatTemplateError) -> (TemplateToken.Kind, Int)? {
        let quote = source[index]
        guard quote == "'" || quote == "\"" else { return nil }
        var end = index + 1
        while end < source.count, source[end] != quote {
            end += source[end] == "\\" ? 2 : 1
        }
        guard end < source.count else { throw syntaxError("unterminated string literal", at: index) }
        let value = try unescape(source[(index + 1)..<end], at: index)
        return (.string(value), end + 1)
    }

    /// Python's `unicode-escape` decoding, which jinja2 applies to string literals.
    private func unescape(_ body: ArraySlice<Unicode.Scalar>, at offset: Int) throws(ChatTemplateError) -> String {
        var result = String.UnicodeScalarView()
        var index = body.startIndex
        func hex(_ count: Int) throws(ChatTemplateError) -> Unicode.Scalar {
            guard body.endIndex - index >= count else { throw syntaxError("truncated \\x, \\u or \\U escape", at: offset) }
            let digits = String(String.UnicodeScalarView(body[index..<index + count]))
            guard let code = UInt32(digits, radix: 16), digits.allSatisfy(\.isHexDigit) else {
                throw syntaxError("truncated \\x, \\u or \\U escape", at: offset)
            }
            guard let scalar = Unicode.Scalar(code) else {
                // Surrogate code points cannot live in a Swift string.
                throw syntaxError("escape \\\(digits) is not a Unicode scalar", at: offset)
            }
            index += count
            return scalar
        }
        while index < body.endIndex {
            let scalar = body[index]
            index += 1
            guard scalar == "\\", index < body.endIndex else {
                result.append(scalar)
                continue
            }
            let escape = body[index]
            index += 1
            switch escape {
            case "\n": break
            case "\\": result.append("\\")
            case "'": result.append("'")
            case "\"": result.append("\"")
            case "a": result.append("\u{07}")
            case "b": result.append("\u{08}")
            case "f": result.append("\u{0C}")
            case "n": result.append("\n")
            case "r": result.append("\r")
            case "t": result.append("\t")
            case "v": result.append("\u{0B}")
            case "x": result.append(try hex(2))
            case "u": result.append(try hex(4))
            case "U": result.append(try hex(8))
            case "0"..."7":
                var code = escape.value - 0x30
                var count = 1
                while count < 3, index < body.endIndex, ("0"..."7").contains(body[index]) {
                    code = code * 8 + body[index].value - 0x30
                    index += 1
                    count += 1
                }
                result.append(Unicode.Scalar(code)!)
            case "N":
                throw syntaxError("\\N{...} escapes are not supported", at: offset)
            default:
                result.append("\\")
                result.append(escape)
            }
        }
        return String(result)
    }
}
