/// A tokenizer.json `post_processor`: adds the special tokens around one encoded sequence.
protocol PostProcessor: Sendable {
    /// How many tokens `process` adds (what truncation leaves room for).
    var addedTokenCount: Int { get }
    func process(ids: [Int], tokens: [String]) -> (ids: [Int], tokens: [String])
}

func makePostProcessor(_ object: JSONObject) throws -> any PostProcessor {
    let type = try object.string("type")
    switch type {
    case "RobertaProcessing", "BertProcessing":
        return try Surround(prefix: [specialToken(object, "cls")], suffix: [specialToken(object, "sep")])
    case "TemplateProcessing":
        return try template(object)
    case "ByteLevel":
        return Surround(prefix: [], suffix: [])
    case "Sequence":
        let processors = try object.objects("processors").map(makePostProcessor)
        return PostProcessorSequence(processors: processors)
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

private func template(_ object: JSONObject) throws -> Surround {
    guard let single = object.values["single"] as? [Any] else { throw object.invalid("single", "expected an array") }
    let specialTokens = try object.optionalObject("special_tokens")
    var prefix: [(id: Int, token: String)] = []
    var suffix: [(id: Int, token: String)] = []
    var sawSequence = false
    for (index, piece) in single.enumerated() {
        let path = "single[\(index)]"
        guard let piece = piece as? [String: Any] else { throw object.invalid(path, "expected an object") }
        if piece["Sequence"] != nil {
            guard !sawSequence else { throw object.invalid(path, "the single template has more than one sequence") }
            sawSequence = true
            continue
        }
        guard let special = piece["SpecialToken"] as? [String: Any], let name = special["id"] as? String else {
            throw object.invalid(path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}")
        }
        guard let entry = specialTokens?.values[name] as? [String: Any], let ids = entry["ids"] as? [Any],
              let tokens = entry["tokens"] as? [String], ids.count == tokens.count else {
            throw object.invalid("special_tokens", "no ids and tokens for \"\(name)\"")
        }
        for (id, token) in zip(ids, tokens) {
            guard let id = JSONObject.integer(id) else { throw object.invalid("special_tokens", "bad id for \"\(name)\"") }
            if sawSequence { suffix.append((id, token)) } else { prefix.append((id, token)) }
        }
    }
    guard sawSequence else { throw object.invalid("single", "the single template has no sequence") }
    return Surround(prefix: prefix, suffix: suffix)
}

/// Fixed special tokens before and after the sequence (RoBERTa's and BERT's processors, single-sequence templates).
struct Surround: PostProcessor {
    let prefix: [(id: Int, token: String)]
    let suffix: [(id: Int, token: String)]

    var addedTokenCount: Int { prefix.count + suffix.count }

    func process(ids: [Int], tokens: [String]) -> (ids: [Int], tokens: [String]) {
        (prefix.map(\.id) + ids + suffix.map(\.id), prefix.map(\.token) + tokens + suffix.map(\.token))
    }
}

struct PostProcessorSequence: PostProcessor {
    let processors: [any PostProcessor]

    var addedTokenCount: Int { processors.reduce(0) { $0 + $1.addedTokenCount } }

    func process(ids: [Int], tokens: [String]) -> (ids: [Int], tokens: [String]) {
        processors.reduce((ids, tokens)) { $1.process(ids: $0.0, tokens: $0.1) }
    }
}
