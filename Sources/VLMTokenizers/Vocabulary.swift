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
    /// Tokens by id: an array for the usual dense ids, a dictionary for ids far beyond the entry count (so that a
    /// hostile file cannot make a giant allocation).
    private var denseTokens: [String?] = []
    private var sparseTokens: [Int: String] = [:]

    init() {}

    /// The vocabulary of a JSON object `{"token": id, ...}`; of tokens written twice the last counts, as in serde_json.
    init(_ object: JSONObject, field: String) throws {
        ids.reserveCapacity(object.members.count)
        for (token, value) in object.members {
            // tokenizers reads ids as u32 and refuses the rest.
            guard let id = JSONObject.integer(value), id >= 0, id <= Int(UInt32.max) else {
                throw object.invalid(field, "id of \"\(token)\" is not an integer from 0 to 4294967295")
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
            if let old = ids[key], self.token(old).map(TokenKey.init) == key { setToken(nil, for: old) }
            ids[key] = newValue
            if let newValue, self.token(newValue) == nil { setToken(token, for: newValue) }
        }
    }

    func token(_ id: Int) -> String? {
        if id >= 0 && id < denseTokens.count, let token = denseTokens[id] { return token }
        return sparseTokens.isEmpty ? nil : sparseTokens[id]
    }

    private mutating func setToken(_ token: String?, for id: Int) {
        if token == nil {
            if id >= 0 && id < denseTokens.count { denseTokens[id] = nil }
            sparseTokens[id] = nil
        } else if id >= 0 && id < 2 * ids.count + 65536 {
            if id >= denseTokens.count { denseTokens += repeatElement(nil, count: id + 1 - denseTokens.count) }
            denseTokens[id] = token
        } else {
            sparseTokens[id] = token
        }
    }

    var entries: some Sequence<(key: TokenKey, value: Int)> { ids }
}

/// Vocabulary pieces as paths of scalars, for longest-prefix matches without building a string per candidate.
struct ScalarTrie: Sendable {
    /// Children: parent node << 32 | scalar → child node.
    private var edges: [UInt64: UInt32] = [:]
    /// The piece id ending at each node, -1 where none does. Full-width: an id may take all 32 bits of tokenizers' u32.
    private var ids: [Int] = [-1]

    mutating func insert(_ scalars: some Sequence<Unicode.Scalar>, id: Int) {
        var node: UInt32 = 0
        for scalar in scalars {
            let key = UInt64(node) << 32 | UInt64(scalar.value)
            if let child = edges[key] {
                node = child
            } else {
                ids.append(-1)
                node = UInt32(ids.count - 1)
                edges[key] = node
            }
        }
        ids[Int(node)] = id
    }

    /// The longest piece that `word` has at `start`: where it ends and its id.
    func longestMatch(in word: [Unicode.Scalar], from start: Int) -> (end: Int, id: Int)? {
        var node: UInt32 = 0
        var best: (end: Int, id: Int)?
        var position = start
        while position < word.count, let child = edges[UInt64(node) << 32 | UInt64(word[position].value)] {
            node = child
            position += 1
            let id = ids[Int(node)]
            if id >= 0 { best = (position, id) }
        }
        return best
    }

    /// Each piece that `word` has at `start`, shortest first: where it ends and its id.
    func forEachMatch(in word: [Unicode.Scalar], from start: Int, _ body: (_ end: Int, _ id: Int) -> Void) {
        var node: UInt32 = 0
        var position = start
        while position < word.count, let child = edges[UInt64(node) << 32 | UInt64(word[position].value)] {
            node = child
            position += 1
            let id = ids[Int(node)]
            if id >= 0 { body(position, id) }
        }
    }
}
