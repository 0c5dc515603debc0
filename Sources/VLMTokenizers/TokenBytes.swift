extension Tokenizer {
    /// The bytes each of the ids `0..<count` contributes to decoded text, found as transformers'
    /// `StopStringCriteria.clean_tokenizer_vocab` does: byte tokens (`<0xXX>`, and byte-level pieces whose text does
    /// not decode on its own) as their bytes, others as the text they add after a fixed prefix (so that leading spaces
    /// survive). Stop strings are matched against these.
    public func tokenBytes(count: Int) -> [[UInt8]] {
        let prefix = encode("abcdef", addSpecialTokens: false).ids
        let prefixLength = decode(prefix).unicodeScalars.count
        return (0..<count).map { id in
            let token = self.token(id) ?? ""
            if token.utf8.count == 6, token.hasPrefix("<0x"), token.hasSuffix(">"),
               let byte = UInt8(token.dropFirst(3).dropLast(), radix: 16) {
                return [byte]
            }
            let text = String(decode(prefix + [id]).unicodeScalars.dropFirst(prefixLength))
            if text.unicodeScalars.contains("\u{FFFD}") {
                let bytes = token.unicodeScalars.compactMap { ByteLevelAlphabet.bytes[$0] }
                if bytes.count == token.unicodeScalars.count { return bytes }
            }
            return Array(text.utf8)
        }
    }
}
