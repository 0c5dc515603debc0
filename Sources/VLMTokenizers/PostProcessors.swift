/// One sequence's encoding on its way through the post-processor (tokenizers' `Encoding` before merging).
struct EncodingParts {
    var ids: [Int] = []
    var tokens: [String] = []
    var offsets: [Range<Int>] = []
    var typeIds: [Int] = []
    var specialTokensMask: [Int] = []
    /// What truncation cut off, as whole windows; they carry no overflowing parts of their own (tokenizers nests
    /// some, but transformers never returns them).
    var overflowing: [EncodingParts] = []

    /// tokenizers' `Encoding::merge_with`: each overflowing part of either side is combined with the other side and
    /// with the other side's overflowing parts.
    mutating func append(_ other: EncodingParts) {
        if !overflowing.isEmpty || !other.overflowing.isEmpty {
            var merged: [EncodingParts] = []
            for mine in overflowing {
                merged.append(mine.concatenated(other))
                for theirs in other.overflowing { merged.append(mine.concatenated(theirs)) }
            }
            for theirs in other.overflowing { merged.append(concatenated(theirs)) }
            overflowing = merged
        }
        ids += other.ids
        tokens += other.tokens
        offsets += other.offsets
        typeIds += other.typeIds
        specialTokensMask += other.specialTokensMask
    }

    private func concatenated(_ other: EncodingParts) -> EncodingParts {
        var result = self
        result.overflowing = []
        result.ids += other.ids
        result.tokens += other.tokens
        result.offsets += other.offsets
        result.typeIds += other.typeIds
        result.specialTokensMask += other.specialTokensMask
        return result
    }

    private func slice(_ range: Range<Int>) -> EncodingParts {
        EncodingParts(ids: Array(ids[range]), tokens: Array(tokens[range]), offsets: Array(offsets[range]),
                      typeIds: Array(typeIds[range]), specialTokensMask: Array(specialTokensMask[range]))
    }

    /// tokenizers' `Encoding::truncate`: keeps the first (or, `fromLeft`, the last) `maxLength` tokens; the rest
    /// become overflowing windows of `maxLength` tokens that each repeat `stride` tokens of the window before.
    mutating func truncate(to maxLength: Int, stride: Int = 0, fromLeft: Bool) throws(TruncationError) {
        let count = ids.count
        guard maxLength < count else { return }
        guard maxLength > 0 else {
            var whole = self
            whole.overflowing = []
            self = EncodingParts(overflowing: [whole])
            return
        }
        guard stride < maxLength else { throw .strideTooLong(stride: stride, maxLength: maxLength) }
        let step = maxLength - stride
        var windows: [Range<Int>] = []
        if fromLeft {
            var stop = count
            while true {
                let start = max(0, stop - maxLength)
                windows.append(start..<stop)
                if start == 0 || stop <= step { break }
                stop -= step
            }
        } else {
            var start = 0
            while true {
                let stop = min(start + maxLength, count)
                windows.append(start..<stop)
                if stop == count { break }
                start += step
            }
        }
        var first = slice(windows[0])
        first.overflowing = windows.dropFirst().map(slice)
        self = first
    }
}

/// A tokenizer.json `post_processor`: adds the special tokens around one sequence or a pair, sets type ids.
protocol PostProcessor: Sendable {
    /// How many tokens `process` adds (what truncation leaves room for).
    func addedTokenCount(pair: Bool) -> Int
    func process(_ encodings: [EncodingParts], addSpecialTokens: Bool) -> [EncodingParts]
}

func makePostProcessor(_ object: JSONObject) throws -> any PostProcessor {
    let type = try object.string("type")
    switch type {
    case "BertProcessing":
        let cls = try specialToken(object, "cls"), sep = try specialToken(object, "sep")
        return Template(
            single: [.special([cls], typeId: 0), .sequence(second: false, typeId: 0), .special([sep], typeId: 0)],
            pair: [.special([cls], typeId: 0), .sequence(second: false, typeId: 0), .special([sep], typeId: 0),
                   .sequence(second: true, typeId: 1), .special([sep], typeId: 1)])
    case "RobertaProcessing":
        let cls = try specialToken(object, "cls"), sep = try specialToken(object, "sep")
        let template = Template(
            single: [.special([cls], typeId: 0), .sequence(second: false, typeId: 0), .special([sep], typeId: 0)],
            pair: [.special([cls], typeId: 0), .sequence(second: false, typeId: 0), .special([sep, sep], typeId: 0),
                   .sequence(second: true, typeId: 0), .special([sep], typeId: 0)],
            overflowingTypeId: 0)
        let trim = try object.bool("trim_offsets", default: true)
        return PostProcessorSequence(processors: [
            ByteLevelOffsetTrimming(trimOffsets: trim, addPrefixSpace: try object.bool("add_prefix_space", default: true)),
            template,
        ])
    case "TemplateProcessing":
        let specialTokens = try object.optionalObject("special_tokens")
        return Template(single: try templatePieces(object, "single", specialTokens),
                        pair: try templatePieces(object, "pair", specialTokens))
    case "ByteLevel":
        return ByteLevelOffsetTrimming(trimOffsets: try object.bool("trim_offsets", default: true),
                                       addPrefixSpace: try object.bool("add_prefix_space", default: true))
    case "Sequence":
        return PostProcessorSequence(processors: try object.objects("processors").map(makePostProcessor))
    default:
        throw TokenizerError.unsupportedComponent(file: object.file, path: object.path, type: type)
    }
}

/// `["<s>", 0]`: a token and its id.
private func specialToken(_ object: JSONObject, _ key: String) throws -> (id: Int, token: String) {
    guard let pair = object.values[key] as? [Any], pair.count == 2, let token = pair[0] as? String,
          let id = JSONObject.integer(pair[1]) else {
        throw object.invalid(key, "expected [token, id]")
    }
    return (id, token)
}

private func templatePieces(_ object: JSONObject, _ key: String, _ specialTokens: JSONObject?) throws -> [Template.Piece] {
    guard let pieces = object.values[key] as? [Any] else { throw object.invalid(key, "expected an array") }
    return try pieces.enumerated().map { index, piece in
        let path = "\(key)[\(index)]"
        guard let piece = (piece as? JSONMembers)?.dictionary else { throw object.invalid(path, "expected an object") }
        if let sequence = (piece["Sequence"] as? JSONMembers)?.dictionary, let name = sequence["id"] as? String, name == "A" || name == "B" {
            return .sequence(second: name == "B", typeId: JSONObject.integer(sequence["type_id"]) ?? 0)
        }
        guard let special = (piece["SpecialToken"] as? JSONMembers)?.dictionary, let name = special["id"] as? String else {
            throw object.invalid(path, "expected {\"Sequence\": {\"id\": \"A\" or \"B\"}} or {\"SpecialToken\": ...}")
        }
        guard let entry = (specialTokens?.values[name] as? JSONMembers)?.dictionary, let ids = entry["ids"] as? [Any],
              let tokens = entry["tokens"] as? [String], ids.count == tokens.count else {
            throw object.invalid("special_tokens", "no ids and tokens for \"\(name)\"")
        }
        let pairs = try zip(ids, tokens).map { id, token in
            guard let id = JSONObject.integer(id) else { throw object.invalid("special_tokens", "bad id for \"\(name)\"") }
            return (id: id, token: token)
        }
        return .special(pairs, typeId: JSONObject.integer(special["type_id"]) ?? 0)
    }
}

/// TemplateProcessing (and BERT's and RoBERTa's processors, which are fixed templates): special tokens and the
/// sequences in the template's order, each with the template's type id.
struct Template: PostProcessor {
    enum Piece {
        case sequence(second: Bool, typeId: Int)
        case special([(id: Int, token: String)], typeId: Int)
    }

    let single: [Piece]
    let pair: [Piece]
    /// The type id RoBERTa's processor gives overflowing parts (all 0); TemplateProcessing and BERT's processor
    /// leave theirs as encoding made them (0 for the first sequence, 1 for the pair).
    var overflowingTypeId: Int? = nil

    func addedTokenCount(pair isPair: Bool) -> Int {
        (isPair ? pair : single).reduce(0) { count, piece in
            if case let .special(tokens, _) = piece { return count + tokens.count }
            return count
        }
    }

    func process(_ encodings: [EncodingParts], addSpecialTokens: Bool) -> [EncodingParts] {
        var result = EncodingParts()
        for piece in encodings.count > 1 ? pair : single {
            switch piece {
            case let .sequence(second, typeId):
                guard let encoding = encodings[safe: second ? 1 : 0] else { continue }
                var part = encoding
                part.typeIds = [Int](repeating: typeId, count: part.ids.count)
                if let overflowingTypeId {
                    for index in part.overflowing.indices {
                        part.overflowing[index].typeIds = [Int](repeating: overflowingTypeId, count: part.overflowing[index].ids.count)
                    }
                }
                result.append(part)
            case let .special(tokens, typeId):
                guard addSpecialTokens else { continue }
                guard result.overflowing.isEmpty else {
                    // As an encoding of its own, so that the overflowing parts get the special tokens too.
                    result.append(EncodingParts(ids: tokens.map(\.id), tokens: tokens.map(\.token),
                                                offsets: [Range<Int>](repeating: 0..<0, count: tokens.count),
                                                typeIds: [Int](repeating: typeId, count: tokens.count),
                                                specialTokensMask: [Int](repeating: 1, count: tokens.count)))
                    continue
                }
                for (id, token) in tokens {
                    result.ids.append(id)
                    result.tokens.append(token)
                    result.offsets.append(0..<0)
                    result.typeIds.append(typeId)
                    result.specialTokensMask.append(1)
                }
            }
        }
        return [result]
    }
}

extension Array {
    subscript(safe index: Int) -> Element? { indices.contains(index) ? self[index] : nil }
}

/// The byte-level processor: leading and trailing spaces (Ġ) leave the tokens' offsets.
struct ByteLevelOffsetTrimming: PostProcessor {
    let trimOffsets: Bool
    let addPrefixSpace: Bool

    func addedTokenCount(pair: Bool) -> Int { 0 }

    func process(_ encodings: [EncodingParts], addSpecialTokens: Bool) -> [EncodingParts] {
        guard trimOffsets else { return encodings }
        return encodings.map { encoding in
            var encoding = trimmed(encoding)
            encoding.overflowing = encoding.overflowing.map(trimmed)
            return encoding
        }
    }

    private func trimmed(_ encoding: EncodingParts) -> EncodingParts {
        let space = ByteLevelAlphabet.characters[0x20]
        func isSpace(_ scalar: Unicode.Scalar) -> Bool { scalar == space || scalar.isRegexWhitespace }
        var encoding = encoding
        for (index, token) in encoding.tokens.enumerated() {
            let scalars = Array(token.unicodeScalars)
            var leading = scalars.prefix(while: isSpace).count
            let trailing = scalars.reversed().prefix(while: isSpace).count
            guard leading > 0 || trailing > 0 else { continue }
            var offsets = encoding.offsets[index]
            if leading > 0 {
                if (index == 0 || offsets.lowerBound == 0) && addPrefixSpace && leading == 1 { leading = 0 }
                let lower = min(offsets.lowerBound + leading, offsets.upperBound)
                offsets = lower..<offsets.upperBound
            }
            if trailing > 0 && offsets.upperBound >= trailing {
                offsets = offsets.lowerBound..<max(offsets.upperBound - trailing, offsets.lowerBound)
            }
            encoding.offsets[index] = offsets
        }
        return encoding
    }
}

struct PostProcessorSequence: PostProcessor {
    let processors: [any PostProcessor]

    func addedTokenCount(pair: Bool) -> Int { processors.reduce(0) { $0 + $1.addedTokenCount(pair: pair) } }

    func process(_ encodings: [EncodingParts], addSpecialTokens: Bool) -> [EncodingParts] {
        processors.reduce(encodings) { $1.process($0, addSpecialTokens: addSpecialTokens) }
    }
}
