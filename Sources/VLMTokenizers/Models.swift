import Foundation
import Synchronization

/// One token a model made of a word: its id, the scalars of the word it covers, and its string when that is not the
/// vocabulary's (Unigram spells unknown pieces as the text they cover).
struct ModelToken: Sendable, Equatable {
    let id: Int
    let range: Range<Int>
    var text: String? = nil
}

/// A tokenizer.json `model`: turns one pre-tokenized word into vocabulary ids.
protocol TokenizationModel: Sendable {
    func tokenize(_ word: [Unicode.Scalar]) -> [ModelToken]
    func tokenId(_ token: String) -> Int?
    func token(_ id: Int) -> String?
    /// How many entries the vocabulary has (the first id an added token outside it gets).
    var vocabularySize: Int { get }
}

func makeModel(_ object: JSONObject) throws -> any TokenizationModel {
    // Old files leave out "type"; their fields say which model they are.
    let type = try object.optionalString("type") ?? (object.values["merges"] != nil ? "BPE" : "WordPiece")
    switch type {
    case "BPE":
        guard let merges = object.values["merges"] as? [Any] else { throw object.invalid("merges", "expected an array") }
        var pairs: [(String, String)] = []
        pairs.reserveCapacity(merges.count)
        for (index, merge) in merges.enumerated() {
            if let parts = merge as? [String], parts.count == 2 {
                pairs.append((parts[0], parts[1]))
            } else if let line = merge as? String,
                      case let parts = line.unicodeScalars.split(separator: " ", omittingEmptySubsequences: false),
                      parts.count == 2 {
                pairs.append((String(String.UnicodeScalarView(parts[0])), String(String.UnicodeScalarView(parts[1]))))
            } else {
                throw object.invalid("merges[\(index)]", "expected \"a b\" or [\"a\", \"b\"]")
            }
        }
        return try BPE(
            vocabulary: try Vocabulary(try object.object("vocab"), field: "vocab"), merges: pairs, file: object.file,
            unknownToken: try object.optionalString("unk_token"),
            continuingSubwordPrefix: try object.optionalString("continuing_subword_prefix") ?? "",
            endOfWordSuffix: try object.optionalString("end_of_word_suffix") ?? "",
            fuseUnknown: try object.bool("fuse_unk", default: false),
            byteFallback: try object.bool("byte_fallback", default: false),
            ignoreMerges: try object.bool("ignore_merges", default: false))
    case "WordPiece":
        return WordPiece(
            vocabulary: try Vocabulary(try object.object("vocab"), field: "vocab"),
            unknownToken: try object.optionalString("unk_token") ?? "[UNK]",
            continuingSubwordPrefix: try object.optionalString("continuing_subword_prefix") ?? "##",
            maxInputCharactersPerWord: object.isNull("max_input_chars_per_word") ? 100 : try object.int("max_input_chars_per_word"))
    case "Unigram":
        return try Unigram(object)
    case "WordLevel":
        return WordLevel(vocabulary: try Vocabulary(try object.object("vocab"), field: "vocab"),
                         unknownToken: try object.optionalString("unk_token"))
    default:
        throw TokenizerError.unsupportedComponent(file: object.file, path: object.path, type: type)
    }
}

/// Byte-pair encoding: a word starts as its characters and merges the adjacent pair of lowest rank until none is left.
final class BPE: TokenizationModel {
    private struct Merge { let rank: UInt32; let id: Int }

    let vocabulary: Vocabulary
    private let merges: [UInt64: Merge]
    let unknownToken: String?
    let continuingSubwordPrefix: String
    let endOfWordSuffix: String
    private let fuseUnknown: Bool
    private let byteFallback: Bool
    private let ignoreMerges: Bool
    private let cache = Mutex<[[Unicode.Scalar]: [ModelToken]]>([:])
    private static let cacheCapacity = 10_000

    var vocabularySize: Int { vocabulary.count }

    init(vocabulary: Vocabulary, merges: [(String, String)], file: String, unknownToken: String?,
         continuingSubwordPrefix: String, endOfWordSuffix: String, fuseUnknown: Bool = false,
         byteFallback: Bool = false, ignoreMerges: Bool = false) throws {
        self.vocabulary = vocabulary
        var table: [UInt64: Merge] = [:]
        table.reserveCapacity(merges.count)
        for (rank, (left, right)) in merges.enumerated() {
            let merged = left + (right.droppingScalarPrefix(continuingSubwordPrefix) ?? right)
            guard let leftId = vocabulary[left], let rightId = vocabulary[right], let mergedId = vocabulary[merged] else {
                throw TokenizerError.mergeOutOfVocabulary(file: file, index: rank, merge: "\(left) \(right)")
            }
            let key = BPE.pairKey(leftId, rightId)
            // The first (lowest-rank) occurrence of a pair wins, as in tokenizers.
            if table[key] == nil { table[key] = Merge(rank: UInt32(rank), id: mergedId) }
        }
        self.merges = table
        self.unknownToken = unknownToken
        self.continuingSubwordPrefix = continuingSubwordPrefix
        self.endOfWordSuffix = endOfWordSuffix
        self.fuseUnknown = fuseUnknown
        self.byteFallback = byteFallback
        self.ignoreMerges = ignoreMerges
    }

    func tokenId(_ token: String) -> Int? { vocabulary[token] }
    func token(_ id: Int) -> String? { vocabulary.token(id) }

    private init(_ other: BPE, unknownToken: String?, fuseUnknown: Bool, byteFallback: Bool, ignoreMerges: Bool) {
        vocabulary = other.vocabulary
        merges = other.merges
        continuingSubwordPrefix = other.continuingSubwordPrefix
        endOfWordSuffix = other.endOfWordSuffix
        self.unknownToken = unknownToken
        self.fuseUnknown = fuseUnknown
        self.byteFallback = byteFallback
        self.ignoreMerges = ignoreMerges
    }

    /// The same vocabulary and merges with other options, as a tokenizer class that builds its own BPE from a
    /// file's vocabulary and merges has them.
    func reconfigured(unknownToken: String?, fuseUnknown: Bool, byteFallback: Bool, ignoreMerges: Bool) -> BPE {
        BPE(self, unknownToken: unknownToken, fuseUnknown: fuseUnknown, byteFallback: byteFallback, ignoreMerges: ignoreMerges)
    }

    private static func pairKey(_ left: Int, _ right: Int) -> UInt64 { UInt64(UInt32(truncatingIfNeeded: left)) << 32 | UInt64(UInt32(truncatingIfNeeded: right)) }

    func tokenize(_ word: [Unicode.Scalar]) -> [ModelToken] {
        if word.isEmpty { return [] }
        if let cached = cache.withLock({ $0[word] }) { return cached }
        let ids = merge(word)
        cache.withLock { cache in
            if cache.count < BPE.cacheCapacity { cache[word] = ids }
        }
        return ids
    }

    /// The word's characters as vocabulary ids, with prefix and suffix applied, unknowns as tokenizers handles them.
    private func initialSymbols(_ word: [Unicode.Scalar]) -> (ids: [Int], ranges: [Range<Int>]) {
        var symbols: [Int] = []
        var ranges: [Range<Int>] = []
        symbols.reserveCapacity(word.count)
        ranges.reserveCapacity(word.count)
        var pendingUnknown: Range<Int>?
        let unknownId = unknownToken.flatMap { vocabulary[$0] }
        func flushUnknown() {
            if let range = pendingUnknown, let unknownId { symbols.append(unknownId); ranges.append(range) }
            pendingUnknown = nil
        }
        for (index, scalar) in word.enumerated() {
            var piece = String(scalar)
            if index > 0 && !continuingSubwordPrefix.isEmpty { piece = continuingSubwordPrefix + piece }
            if index == word.count - 1 && !endOfWordSuffix.isEmpty { piece += endOfWordSuffix }
            if let id = vocabulary[piece] {
                flushUnknown()
                symbols.append(id)
                ranges.append(index..<index + 1)
                continue
            }
            if byteFallback {
                let byteIds = UTF8.encode(scalar)!.map { vocabulary["<0x" + hex($0) + ">"] }
                if byteIds.allSatisfy({ $0 != nil }) {
                    flushUnknown()
                    for id in byteIds { symbols.append(id!); ranges.append(index..<index + 1) }
                    continue
                }
            }
            guard unknownId != nil else { continue }
            if let pending = pendingUnknown, fuseUnknown {
                pendingUnknown = pending.lowerBound..<index + 1
            } else {
                flushUnknown()
                pendingUnknown = index..<index + 1
            }
        }
        flushUnknown()
        return (symbols, ranges)
    }

    private func merge(_ word: [Unicode.Scalar]) -> [ModelToken] {
        if ignoreMerges, let id = vocabulary[String(String.UnicodeScalarView(word))] { return [ModelToken(id: id, range: 0..<word.count)] }
        var (ids, ranges) = initialSymbols(word)
        let count = ids.count
        if count < 2 { return zip(ids, ranges).map { ModelToken(id: $0, range: $1) } }
        // A doubly linked list over the symbols; merged-away symbols are marked dead rather than removed.
        var next = Array(1...count)
        next[count - 1] = -1
        var previous = Array(-1..<(count - 1))
        var alive = [Bool](repeating: true, count: count)
        // Queue entries are rank << 32 | position: popping the smallest gives the lowest rank, leftmost first.
        var queue = MinHeap()
        for position in 0..<(count - 1) {
            if let merge = merges[BPE.pairKey(ids[position], ids[position + 1])] {
                queue.push(UInt64(merge.rank) << 32 | UInt64(position))
            }
        }
        while let top = queue.pop() {
            let position = Int(top & 0xFFFF_FFFF)
            let rank = UInt32(top >> 32)
            guard alive[position], next[position] >= 0 else { continue }
            let right = next[position]
            // Stale entries: the pair at this position changed since it was queued.
            guard let merge = merges[BPE.pairKey(ids[position], ids[right])], merge.rank == rank else { continue }
            ids[position] = merge.id
            ranges[position] = ranges[position].lowerBound..<ranges[right].upperBound
            alive[right] = false
            next[position] = next[right]
            if next[right] >= 0 { previous[next[right]] = position }
            if previous[position] >= 0, let merge = merges[BPE.pairKey(ids[previous[position]], ids[position])] {
                queue.push(UInt64(merge.rank) << 32 | UInt64(previous[position]))
            }
            if next[position] >= 0, let merge = merges[BPE.pairKey(ids[position], ids[next[position]])] {
                queue.push(UInt64(merge.rank) << 32 | UInt64(position))
            }
        }
        return (0..<count).filter { alive[$0] }.map { ModelToken(id: ids[$0], range: ranges[$0]) }
    }
}

private func hex(_ byte: UInt8) -> String {
    let digits = Array("0123456789ABCDEF")
    return String([digits[Int(byte >> 4)], digits[Int(byte & 15)]])
}

/// A binary min-heap of UInt64 keys.
struct MinHeap {
    private var items: [UInt64] = []

    mutating func push(_ item: UInt64) {
        items.append(item)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            if items[parent] <= items[child] { break }
            items.swapAt(parent, child)
            child = parent
        }
    }

    mutating func pop() -> UInt64? {
        guard let top = items.first else { return nil }
        let last = items.removeLast()
        if !items.isEmpty {
            items[0] = last
            var parent = 0
            while true {
                let left = 2 * parent + 1
                if left >= items.count { break }
                let right = left + 1
                let child = right < items.count && items[right] < items[left] ? right : left
                if items[parent] <= items[child] { break }
                items.swapAt(parent, child)
                parent = child
            }
        }
        return top
    }
}

/// WordPiece: the longest vocabulary prefix, then the longest `##`-continuation, and so on; the unknown token if stuck.
struct WordPiece: TokenizationModel {
    let vocabulary: Vocabulary
    let unknownToken: String
    let continuingSubwordPrefix: String
    let maxInputCharactersPerWord: Int
    private let unknownId: Int?
    /// Every piece, for a word's start; and the pieces that begin with the prefix, without it, for what follows.
    private let starts: ScalarTrie
    private let continuations: ScalarTrie

    init(vocabulary: Vocabulary, unknownToken: String, continuingSubwordPrefix: String, maxInputCharactersPerWord: Int) {
        self.vocabulary = vocabulary
        self.unknownToken = unknownToken
        self.continuingSubwordPrefix = continuingSubwordPrefix
        self.maxInputCharactersPerWord = maxInputCharactersPerWord
        unknownId = vocabulary[unknownToken]
        var starts = ScalarTrie()
        var continuations = ScalarTrie()
        let prefix = Array(continuingSubwordPrefix.unicodeScalars)
        for (key, id) in vocabulary.entries {
            let scalars = Array(key.text.unicodeScalars)
            starts.insert(scalars, id: id)
            if scalars.starts(with: prefix) { continuations.insert(scalars[prefix.count...], id: id) }
        }
        self.starts = starts
        self.continuations = continuations
    }

    var vocabularySize: Int { vocabulary.count }
    func tokenId(_ token: String) -> Int? { vocabulary[token] }
    func token(_ id: Int) -> String? { vocabulary.token(id) }

    func tokenize(_ word: [Unicode.Scalar]) -> [ModelToken] {
        let unknown = unknownId.map { [ModelToken(id: $0, range: 0..<word.count)] } ?? []
        if word.count > maxInputCharactersPerWord { return unknown }
        var tokens: [ModelToken] = []
        var start = 0
        while start < word.count {
            guard let match = (start == 0 ? starts : continuations).longestMatch(in: word, from: start) else { return unknown }
            tokens.append(ModelToken(id: match.id, range: start..<match.end))
            start = match.end
        }
        return tokens
    }
}

/// WordLevel: whole words looked up in the vocabulary, the unknown token otherwise.
struct WordLevel: TokenizationModel {
    let vocabulary: Vocabulary
    let unknownToken: String?

    var vocabularySize: Int { vocabulary.count }
    func tokenId(_ token: String) -> Int? { vocabulary[token] }
    func token(_ id: Int) -> String? { vocabulary.token(id) }

    func tokenize(_ word: [Unicode.Scalar]) -> [ModelToken] {
        if let id = vocabulary[String(String.UnicodeScalarView(word))] { return [ModelToken(id: id, range: 0..<word.count)] }
        guard let id = unknownToken.flatMap({ vocabulary[$0] }) else { return [] }
        return [ModelToken(id: id, range: 0..<word.count)]
    }
}

/// SentencePiece's unigram model: the segmentation with the highest total log-probability (Viterbi), unknown
/// characters scored below every piece and fused together, optionally spelled as UTF-8 byte tokens.
struct Unigram: TokenizationModel {
    private let pieces: [String]
    private let scores: [Double]
    private let ids: [TokenKey: Int]
    /// The pieces by their scalars (a repeated piece has its last id, as in tokenizers' token_to_ids).
    private let trie: ScalarTrie
    private let unknownId: Int?
    private let unknownScore: Double
    private let byteFallback: Bool

    var vocabularySize: Int { pieces.count }
    func tokenId(_ token: String) -> Int? { ids[TokenKey(token)] }
    func token(_ id: Int) -> String? { id >= 0 && id < pieces.count ? pieces[id] : nil }

    init(_ object: JSONObject) throws {
        guard let vocab = object.values["vocab"] as? [Any] else { throw object.invalid("vocab", "expected an array of [piece, score]") }
        var pieces: [String] = []
        var scores: [Double] = []
        pieces.reserveCapacity(vocab.count)
        scores.reserveCapacity(vocab.count)
        for (index, entry) in vocab.enumerated() {
            guard let pair = entry as? [Any], pair.count == 2, let piece = pair[0] as? String,
                  let score = (pair[1] as? NSNumber)?.doubleValue, !(pair[1] is String) else {
                throw object.invalid("vocab[\(index)]", "expected [piece, score]")
            }
            pieces.append(piece)
            scores.append(score)
        }
        let unknownId = object.isNull("unk_id") ? nil : try object.int("unk_id")
        if let unknownId, !(0..<pieces.count).contains(unknownId) {
            throw object.invalid("unk_id", "\(unknownId) is outside the \(pieces.count)-piece vocabulary")
        }
        self.init(pieces: pieces, scores: scores, unknownId: unknownId,
                  byteFallback: try object.bool("byte_fallback", default: false))
    }

    /// The model of a SentencePiece file's pieces and scores; `unknownId`, when given, indexes `pieces`.
    init(pieces: [String], scores: [Double], unknownId: Int?, byteFallback: Bool) {
        var ids: [TokenKey: Int] = [:]
        var trie = ScalarTrie()
        for (id, piece) in pieces.enumerated() {
            ids[TokenKey(piece)] = id
            trie.insert(piece.unicodeScalars, id: id)
        }
        self.pieces = pieces
        self.scores = scores
        self.ids = ids
        self.trie = trie
        self.unknownId = unknownId
        // tokenizers' kUnkPenalty.
        unknownScore = (scores.min() ?? 0) - 10
        self.byteFallback = byteFallback
    }

    func tokenize(_ word: [Unicode.Scalar]) -> [ModelToken] {
        if word.isEmpty { return [] }
        let count = word.count
        var bestScore = [Double](repeating: 0, count: count + 1)
        var bestStart = [Int](repeating: -1, count: count + 1)
        var bestId = [Int](repeating: 0, count: count + 1)
        for start in 0..<count where start == 0 || bestStart[start] >= 0 {
            let scoreSoFar = bestScore[start]
            var hasSingle = false
            // Shortest first, and only a strictly better score replaces: tokenizers' encode_optimized.
            trie.forEachMatch(in: word, from: start) { end, id in
                let candidate = scoreSoFar + scores[id]
                if bestStart[end] < 0 || candidate > bestScore[end] {
                    bestScore[end] = candidate
                    bestStart[end] = start
                    bestId[end] = id
                }
                if end == start + 1 { hasSingle = true }
            }
            if !hasSingle, let unknownId {
                let candidate = scoreSoFar + unknownScore
                if bestStart[start + 1] < 0 || candidate > bestScore[start + 1] {
                    bestScore[start + 1] = candidate
                    bestStart[start + 1] = start
                    bestId[start + 1] = unknownId
                }
            }
        }
        // Without an unknown piece a character may be unreachable; tokenizers then fails, here it is dropped.
        var pieces: [(range: Range<Int>, id: Int)] = []
        var end = count
        while end > 0 {
            var start = bestStart[end]
            if start < 0 { end -= 1; continue }
            let id = bestId[end]
            if id == unknownId {
                // Consecutive unknowns fuse into one piece.
                while start > 0, bestStart[start] >= 0, bestId[start] == unknownId { start = bestStart[start] }
            }
            pieces.append((start..<end, id))
            end = start
        }
        var tokens: [ModelToken] = []
        tokens.reserveCapacity(pieces.count)
        for (range, _) in pieces.reversed() {
            let text = String(String.UnicodeScalarView(word[range]))
            // tokenizers looks the piece up again by its text: fused unknowns that spell a piece get its id.
            if let known = ids[TokenKey(text)] {
                tokens.append(ModelToken(id: known, range: range))
                continue
            }
            if byteFallback {
                let byteIds = text.utf8.map { ids[TokenKey("<0x" + hex($0) + ">")] }
                if byteIds.allSatisfy({ $0 != nil }) {
                    tokens += byteIds.map { ModelToken(id: $0!, range: range) }
                    continue
                }
            }
            tokens.append(ModelToken(id: unknownId ?? 0, range: range, text: text))
        }
        return tokens
    }
}
