/// A `regex.sub` replacement template, read as the module reads one.
struct PythonRegexTemplate {
    private enum Piece {
        case text([Unicode.Scalar])
        case group(Int)
    }

    private var pieces: [Piece] = []
    /// A `\N` reference to a group the pattern lacks: the module only complains once something matches.
    private(set) var missingGroup: Int?

    init(_ template: String, for regex: PythonRegex) throws(PythonRegexError) {
        let scalars = Array(template.unicodeScalars)
        var literal: [Unicode.Scalar] = []
        var index = 0
        func fail(_ problem: String) -> PythonRegexError {
            PythonRegexError(pattern: regex.pattern, problem: "replacement template \(problem) at position \(index)")
        }
        func flush() {
            if !literal.isEmpty { pieces.append(.text(literal)) }
            literal.removeAll()
        }
        while index < scalars.count {
            let scalar = scalars[index]
            index += 1
            guard scalar == "\\" else {
                literal.append(scalar)
                continue
            }
            guard index < scalars.count else { throw fail("bad escape (end of pattern)") }
            let escaped = scalars[index]
            index += 1
            switch escaped {
            case "a": literal.append("\u{07}")
            case "b": literal.append("\u{08}")
            case "f": literal.append("\u{0C}")
            case "n": literal.append("\n")
            case "r": literal.append("\r")
            case "t": literal.append("\t")
            case "v": literal.append("\u{0B}")
            case "x", "u", "U":
                let length = escaped == "x" ? 2 : escaped == "u" ? 4 : 8
                guard index + length <= scalars.count,
                      scalars[index..<index + length].allSatisfy(\.properties.isASCIIHexDigit),
                      let value = UInt32(String(String.UnicodeScalarView(scalars[index..<index + length])), radix: 16),
                      let character = Unicode.Scalar(value) else {
                    throw fail("incomplete escape \\\(Character(escaped))")
                }
                literal.append(character)
                index += length
            case "g":
                guard index < scalars.count, scalars[index] == "<" else { throw fail("missing <") }
                let nameStart = index + 1
                guard let close = scalars[nameStart...].firstIndex(where: { $0 == ">" || $0 == ")" }),
                      scalars[close] == ">", close > nameStart else {
                    throw fail("bad character in group name")
                }
                let name = String(String.UnicodeScalarView(scalars[nameStart..<close]))
                index = close + 1
                if name.unicodeScalars.allSatisfy({ ("0"..."9").contains($0) }) {
                    guard let number = Int(name), number <= regex.groupCount else { throw fail("invalid group reference") }
                    flush()
                    pieces.append(.group(number))
                } else {
                    guard PythonRegexParser.isIdentifier(name) else { throw fail("bad character in group name") }
                    guard let number = regex.groupIndex[name] else { throw fail("unknown group \(name)") }
                    flush()
                    pieces.append(.group(number))
                }
            case "0":
                var value: UInt32 = 0
                var taken = 1
                while taken < 3, index < scalars.count, ("0"..."7").contains(scalars[index]) {
                    value = value * 8 + (scalars[index].value - 0x30)
                    index += 1
                    taken += 1
                }
                literal.append(Unicode.Scalar(value)!)
            case "1"..."9":
                var digits = [escaped]
                if index < scalars.count, ("0"..."9").contains(scalars[index]) {
                    digits.append(scalars[index])
                    index += 1
                    if index < scalars.count, (digits + [scalars[index]]).allSatisfy({ ("0"..."7").contains($0) }) {
                        let octal = (digits + [scalars[index]]).reduce(UInt32(0)) { $0 * 8 + ($1.value - 0x30) }
                        index += 1
                        literal.append(Unicode.Scalar(octal & 0x1FF)!)
                        continue
                    }
                }
                let number = digits.reduce(0) { $0 * 10 + Int($1.value - 0x30) }
                if number > regex.groupCount, missingGroup == nil { missingGroup = number }
                flush()
                pieces.append(.group(number))
            case "\\":
                literal.append("\\")
            case "N":
                throw PythonRegexError(pattern: regex.pattern, problem: "replacement template escape \\N not supported")
            default:
                if escaped.isASCII, escaped.properties.isAlphabetic { throw fail("bad escape \\\(Character(escaped))") }
                literal += ["\\", escaped]
            }
        }
        flush()
    }

    func expand(_ match: PythonRegexMatch, in text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var expanded: [Unicode.Scalar] = []
        for piece in pieces {
            switch piece {
            case let .text(scalars):
                expanded += scalars
            case let .group(number):
                let span = number == 0 ? match.range : match.groups[number - 1]
                if let span { expanded += text[span] }
            }
        }
        return expanded
    }
}
