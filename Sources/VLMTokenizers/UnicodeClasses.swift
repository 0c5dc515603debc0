/// Character classes as the regex engines behind `tokenizers` see them, by Unicode general category.
extension Unicode.Scalar {
    /// `\p{L}`.
    var isLetter: Bool {
        switch properties.generalCategory {
        case .uppercaseLetter, .lowercaseLetter, .titlecaseLetter, .modifierLetter, .otherLetter: true
        default: false
        }
    }

    /// `\p{N}`.
    var isNumber: Bool {
        switch properties.generalCategory {
        case .decimalNumber, .letterNumber, .otherNumber: true
        default: false
        }
    }

    /// `\s` of Oniguruma and of Rust's regex, and Rust's `char::is_whitespace`: the White_Space property.
    var isRegexWhitespace: Bool {
        // ASCII first: it is almost all of the text, and the property lookup is comparatively slow.
        if value < 0x80 { return value == 0x20 || (value >= 0x09 && value <= 0x0D) }
        return properties.isWhitespace
    }

    /// `\w` of Rust's regex crate (Unicode word characters), used by added tokens' `single_word`.
    var isRegexWordCharacter: Bool {
        if properties.isAlphabetic || properties.isJoinControl { return true }
        switch properties.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark, .decimalNumber, .connectorPunctuation: return true
        default: return false
        }
    }

    /// What Python's `str.strip()` removes (used by the CLIP decode fix-up that transformers applies).
    var isPythonWhitespace: Bool {
        switch value {
        case 0x09...0x0D, 0x1C...0x20, 0x85, 0xA0, 0x1680, 0x2000...0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
            true
        default: false
        }
    }
}

/// GPT-2's reversible map between bytes and printable characters, which byte-level BPE vocabularies are written in.
enum ByteLevelAlphabet {
    /// The character standing for each byte.
    static let characters: [Unicode.Scalar] = {
        let printable = Set(Array(0x21...0x7E) + Array(0xA1...0xAC) + Array(0xAE...0xFF))
        var characters = [Unicode.Scalar](repeating: " ", count: 256)
        for byte in printable { characters[byte] = Unicode.Scalar(UInt32(byte))! }
        var next: UInt32 = 256
        for byte in 0..<256 where !printable.contains(byte) {
            characters[byte] = Unicode.Scalar(next)!
            next += 1
        }
        return characters
    }()

    /// The byte of each character of the alphabet.
    static let bytes: [Unicode.Scalar: UInt8] = {
        var bytes: [Unicode.Scalar: UInt8] = [:]
        for (byte, character) in characters.enumerated() { bytes[character] = UInt8(byte) }
        return bytes
    }()
}

extension String {
    /// The string without `prefix` when it starts with it, compared scalar by scalar: `String.hasPrefix` compares
    /// grapheme clusters, so "##" is not a prefix of "##ा" (the mark joins the second "#").
    func droppingScalarPrefix(_ prefix: String) -> String? {
        let scalars = unicodeScalars
        guard scalars.starts(with: prefix.unicodeScalars) else { return nil }
        return String(scalars.dropFirst(prefix.unicodeScalars.count))
    }
}
