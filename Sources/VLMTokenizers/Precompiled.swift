import Foundation

/// SentencePiece's normalization rules (`precompiled_charsmap`): a Darts double-array trie over UTF-8 keys whose
/// values point into a pool of NUL-terminated replacements. Applied as tokenizers does: whole grapheme clusters under
/// 6 bytes first, otherwise scalar by scalar; the shortest matching rule wins.
struct PrecompiledNormalizer: Normalizer {
    private let units: [UInt32]
    private let pool: [UInt8]

    init(base64: String, object: JSONObject) throws {
        guard let data = Data(base64Encoded: base64) else {
            throw object.invalid("precompiled_charsmap", "not valid base64")
        }
        try self.init(charsmap: [UInt8](data)) { object.invalid("precompiled_charsmap", $0) }
    }

    /// The rules of a SentencePiece file's `normalizer_spec.precompiled_charsmap`; `invalid` makes the error for a
    /// map that is not one.
    init(charsmap bytes: [UInt8], invalid: (String) -> TokenizerError) throws {
        guard bytes.count >= 4 else { throw invalid("shorter than its 4-byte header") }
        let trieSize = Int(UInt32(bytes[0]) | UInt32(bytes[1]) << 8 | UInt32(bytes[2]) << 16 | UInt32(bytes[3]) << 24)
        guard trieSize % 4 == 0, trieSize <= bytes.count - 4, trieSize > 0 else {
            throw invalid("trie size \(trieSize) does not fit the \(bytes.count)-byte map")
        }
        units = stride(from: 4, to: 4 + trieSize, by: 4).map {
            UInt32(bytes[$0]) | UInt32(bytes[$0 + 1]) << 8 | UInt32(bytes[$0 + 2]) << 16 | UInt32(bytes[$0 + 3]) << 24
        }
        pool = Array(bytes[(4 + trieSize)...])
        guard String(validating: pool, as: UTF8.self) != nil else {
            throw invalid("the replacement pool is not UTF-8")
        }
    }

    /// The replacement of the shortest rule matching a prefix of `key`.
    private func replacement(_ key: [UInt8]) -> [Unicode.Scalar]? {
        func offset(_ unit: UInt32) -> Int { Int((unit >> 10) << ((unit & (1 << 9)) >> 6)) }
        var node = 0
        node ^= offset(units[0])
        for byte in key {
            if byte == 0 { return nil }
            node ^= Int(byte)
            guard node < units.count else { return nil }
            let unit = units[node]
            if unit & ((1 << 31) | 0xFF) != UInt32(byte) { return nil }
            node ^= offset(unit)
            guard node < units.count else { return nil }
            if (unit >> 8) & 1 == 1 {
                let start = Int(units[node] & ((1 << 31) - 1))
                guard start <= pool.count else { return nil }
                let end = pool[start...].firstIndex(of: 0) ?? pool.count
                return Array(String(decoding: pool[start..<end], as: UTF8.self).unicodeScalars)
            }
        }
        return nil
    }

    func normalize(_ text: inout NormalizedText) {
        var changes: [(Unicode.Scalar, Int)] = []
        changes.reserveCapacity(text.scalars.count)
        var modified = false
        func replace(_ old: Int, _ new: [Unicode.Scalar]) {
            modified = true
            changes.append(contentsOf: new.map { ($0, 0) })
            let difference = new.count - old
            if difference > 0 {
                for index in (changes.count - difference)..<changes.count { changes[index].1 = 1 }
            } else if difference < 0, !changes.isEmpty {
                changes[changes.count - 1].1 += difference
            }
        }
        let string = String(String.UnicodeScalarView(text.scalars))
        for grapheme in string {
            let scalars = Array(grapheme.unicodeScalars)
            let utf8 = Array(grapheme.utf8)
            if utf8.count < 6, let new = replacement(utf8) {
                replace(scalars.count, new)
                continue
            }
            for scalar in scalars {
                if let new = replacement(Array(UTF8.encode(scalar)!)) {
                    replace(1, new)
                } else {
                    changes.append((scalar, 0))
                }
            }
        }
        if modified { text.transform(changes) }
    }
}
