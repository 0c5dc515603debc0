/// Token text compared as tokenizers compares it, byte for byte. Swift's `String` equality and hashing are canonical
/// equivalence: "▁Å" with U+212B would find "▁Å" with U+00C5, and decomposed jamo their precomposed syllable.
struct TokenKey: Hashable, Sendable {
    let text: String

    init(_ text: String) { self.text = text }

    static func == (left: TokenKey, right: TokenKey) -> Bool { left.text.utf8.elementsEqual(right.text.utf8) }

    func hash(into hasher: inout Hasher) {
        var text = text
        text.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }
}

/// A model's token strings and ids, looked up byte for byte.
struct Vocabulary: Sendable {
    private var ids: [TokenKey: Int] = [:]
    private var tokens: [Int: String] = [:]

    init() {}

    /// The vocabulary of a JSON object `{"token": id, ...}`; of tokens written twice the last counts, as in serde_json.
    init(_ object: JSONObject, field: String) throws {
        ids.reserveCapacity(object.members.count)
        for (token, value) in object.members {
            guard let id = JSONObject.integer(value), id >= 0 else {
                throw object.invalid(field, "id of \"\(token)\" is not a non-negative integer")
            }
            self[token] = id
        }
    }

    /// How many distinct token strings there are.
    var count: Int { ids.count }

    subscript(token: String) -> Int? {
        get { ids[TokenKey(token)] }
        set {
            let key = TokenKey(token)
            if let old = ids[key], tokens[old].map(TokenKey.init) == key { tokens[old] = nil }
            ids[key] = newValue
            if let newValue, tokens[newValue] == nil { tokens[newValue] = token }
        }
    }

    func token(_ id: Int) -> String? { tokens[id] }

    var entries: some Sequence<(key: TokenKey, value: Int)> { ids }
}
