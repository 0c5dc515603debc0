/// A tokenizer.json `decoder`: turns tokens back into text pieces, which are then concatenated.
protocol Decoder: Sendable {
    func decode(_ tokens: [String]) -> [String]
}

func makeDecoder(_ object: JSONObject) throws -> any Decoder {
    let type = try object.string("type")
    switch type {
    case "ByteLevel": return ByteLevelDecoder()
    case "WordPiece":
        return WordPieceDecoder(prefix: try object.optionalString("prefix") ?? "##",
                                cleanup: try object.bool("cleanup", default: true))
    case "Sequence": return DecoderSequence(decoders: try object.objects("decoders").map(makeDecoder))
    case "ByteFallback": return ByteFallbackDecoder()
    case "Fuse": return FuseDecoder()
    case "Strip":
        let content = Array(try object.string("content").unicodeScalars)
        guard content.count == 1 else { throw object.invalid("content", "expected one character") }
        return StripDecoder(content: content[0], start: try object.int("start"), stop: try object.int("stop"))
    case "Replace":
        return ReplaceDecoder(pattern: try makePattern(try object.object("pattern")),
                              content: Array(try object.string("content").unicodeScalars))
    case "Metaspace":
        let replacement = Array(try object.string("replacement").unicodeScalars)
        guard replacement.count == 1 else { throw object.invalid("replacement", "expected one character") }
        var prepends = try object.optionalString("prepend_scheme").map { $0 != "never" } ?? true
        if object.values["add_prefix_space"] as? Bool == false { prepends = false }
        return MetaspaceDecoder(replacement: replacement[0], dropsFirstReplacement: prepends)
    case "BPEDecoder": return BPEDecoder(suffix: try object.optionalString("suffix") ?? "</w>")
    case "CTC":
        return CTCDecoder(padToken: try object.optionalString("pad_token") ?? "<pad>",
                          wordDelimiterToken: try object.optionalString("word_delimiter_token") ?? "|",
                          cleanup: try object.bool("cleanup", default: true))
    default:
        throw TokenizerError.unsupportedComponent(file: object.file, path: object.path, type: type)
    }
}

struct DecoderSequence: Decoder {
    let decoders: [any Decoder]

    func decode(_ tokens: [String]) -> [String] { decoders.reduce(tokens) { $1.decode($0) } }
}

/// Maps byte-level characters back to bytes; a token with characters outside that alphabet (an added token, say)
/// contributes its own UTF-8. Invalid UTF-8 becomes U+FFFD, as Rust's `from_utf8_lossy` does.
struct ByteLevelDecoder: Decoder {
    func decode(_ tokens: [String]) -> [String] {
        var bytes: [UInt8] = []
        for token in tokens {
            let start = bytes.count
            var inAlphabet = true
            for scalar in token.unicodeScalars {
                guard let byte = ByteLevelAlphabet.bytes[scalar] else { inAlphabet = false; break }
                bytes.append(byte)
            }
            if !inAlphabet {
                bytes.removeSubrange(start...)
                bytes.append(contentsOf: token.utf8)
            }
        }
        return [String(decoding: bytes, as: UTF8.self)]
    }
}

/// Runs of `<0xXX>` tokens become the text of their bytes, or one U+FFFD per byte when that is not valid UTF-8.
struct ByteFallbackDecoder: Decoder {
    func decode(_ tokens: [String]) -> [String] {
        var result: [String] = []
        var bytes: [UInt8] = []
        func flush() {
            guard !bytes.isEmpty else { return }
            if let text = String(validating: bytes, as: UTF8.self) {
                result.append(text)
            } else {
                result += [String](repeating: "\u{FFFD}", count: bytes.count)
            }
            bytes.removeAll()
        }
        for token in tokens {
            let utf8 = Array(token.utf8)
            if utf8.count == 6, token.hasPrefix("<0x"), utf8[5] == UInt8(ascii: ">"),
               let byte = UInt8(String(decoding: utf8[3..<5], as: UTF8.self), radix: 16) {
                bytes.append(byte)
            } else {
                flush()
                result.append(token)
            }
        }
        flush()
        return result
    }
}

struct FuseDecoder: Decoder {
    func decode(_ tokens: [String]) -> [String] { [tokens.joined()] }
}

/// Removes up to `start` leading and `stop` trailing `content` characters from every token.
struct StripDecoder: Decoder {
    let content: Unicode.Scalar
    let start: Int
    let stop: Int

    func decode(_ tokens: [String]) -> [String] {
        tokens.map { token in
            let scalars = Array(token.unicodeScalars)
            var lower = 0
            while lower < min(start, scalars.count) && scalars[lower] == content { lower += 1 }
            var upper = scalars.count
            var stripped = 0
            while stripped < stop && upper > 0 && scalars[upper - 1] == content { upper -= 1; stripped += 1 }
            return String(String.UnicodeScalarView(scalars[lower..<max(lower, upper)]))
        }
    }
}

struct ReplaceDecoder: Decoder {
    let pattern: any Pattern
    let content: [Unicode.Scalar]

    func decode(_ tokens: [String]) -> [String] {
        tokens.map { token in
            var text = NormalizedText(Array(token.unicodeScalars)[...], start: 0)
            text.replace(pattern.matches(in: text.scalars), with: content)
            return String(String.UnicodeScalarView(text.scalars))
        }
    }
}

/// The replacement character back to spaces; the first token's is dropped when the pre-tokenizer prepends one.
struct MetaspaceDecoder: Decoder {
    let replacement: Unicode.Scalar
    let dropsFirstReplacement: Bool

    func decode(_ tokens: [String]) -> [String] {
        tokens.enumerated().map { index, token in
            var result = String.UnicodeScalarView()
            for scalar in token.unicodeScalars {
                if scalar == replacement {
                    if !(index == 0 && dropsFirstReplacement) { result.append(" ") }
                } else {
                    result.append(scalar)
                }
            }
            return String(result)
        }
    }
}

/// The end-of-word suffix becomes a space, except in the last token.
struct BPEDecoder: Decoder {
    let suffix: String

    func decode(_ tokens: [String]) -> [String] {
        tokens.enumerated().map { index, token in
            replacingScalars(in: token, of: suffix, with: index == tokens.count - 1 ? "" : " ")
        }
    }
}

/// CTC output: repeated tokens collapse, padding disappears, the word delimiter becomes a space.
struct CTCDecoder: Decoder {
    let padToken: String
    let wordDelimiterToken: String
    let cleanup: Bool

    func decode(_ tokens: [String]) -> [String] {
        var deduplicated: [String] = []
        for token in tokens where deduplicated.last != token { deduplicated.append(token) }
        return deduplicated.compactMap { token in
            var text = replacingScalars(in: token, of: padToken, with: "")
            if cleanup {
                text = replacingScalars(in: cleanUpTokenization(text), of: wordDelimiterToken, with: " ")
            }
            return text.isEmpty ? nil : text
        }
    }
}

struct WordPieceDecoder: Decoder {
    let prefix: String
    let cleanup: Bool

    func decode(_ tokens: [String]) -> [String] {
        tokens.enumerated().map { index, token in
            var token = token
            if index > 0 {
                if let rest = token.droppingScalarPrefix(prefix) {
                    token = rest
                } else {
                    token = " " + token
                }
            }
            return cleanup ? cleanUpTokenization(token) : token
        }
    }
}

/// The space cleanup of WordPiece decoding ("do not" included, which transformers' own version lacks).
func cleanUpTokenization(_ text: String, includingDoNot: Bool = true) -> String {
    var replacements = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m")]
    if includingDoNot { replacements.append((" do not", " don't")) }
    replacements += [(" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]
    return replacements.reduce(text) { replacingScalars(in: $0, of: $1.0, with: $1.1) }
}

/// Plain scalar-by-scalar replacement (Foundation's would compare canonically equivalent text as equal).
func replacingScalars(in text: String, of target: String, with replacement: String) -> String {
    let scalars = Array(text.unicodeScalars)
    let matches = LiteralPattern(literal: Array(target.unicodeScalars)).matches(in: scalars)
    if matches.isEmpty { return text }
    var result = String.UnicodeScalarView()
    var previous = 0
    for match in matches {
        result.append(contentsOf: scalars[previous..<match.lowerBound])
        result.append(contentsOf: replacement.unicodeScalars)
        previous = match.upperBound
    }
    result.append(contentsOf: scalars[previous...])
    return String(result)
}
