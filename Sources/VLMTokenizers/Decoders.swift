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
