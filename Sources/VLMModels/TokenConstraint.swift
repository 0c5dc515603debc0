/// Limits which tokens a sequence may continue with (a grammar or a JSON schema); each sequence gets its own
/// ``TokenConstraint`` from it.
public protocol GenerationConstraint: Sendable {
    func start() -> any TokenConstraint
}

/// One sequence's constraint as it is generated: asked about the next token, then told which token was chosen.
///
/// Generation asks ``allows(_:)`` about the token it would pick and masks the scores with ``restrict(_:)`` only
/// when that token is refused (greedy decoding, where the best allowed token is the same either way) or before
/// sampling (so that the distribution drawn from is exactly the allowed tokens').
public protocol TokenConstraint: AnyObject {
    /// Whether `token` may come next.
    func allows(_ token: Int) -> Bool
    /// Sets the score of every token that may not come next to -infinity; false when none may.
    func restrict(_ scores: inout [Float]) -> Bool
    /// Takes `token` as the sequence's next token.
    func accept(_ token: Int)
}

extension TokenConstraint {
    /// The token greedy decoding picks from processed `scores` under the constraint, nil when no token may come.
    func bestAllowed(_ scores: inout [Float]) -> Int? {
        let best = argmax(scores)
        if scores[best] != -.infinity && allows(best) { return best }
        guard restrict(&scores) else { return nil }
        let allowed = argmax(scores)
        return scores[allowed] == -.infinity ? nil : allowed
    }
}

/// The next token from a row's `scores`: the logits processors, then the argmax or a draw; under a constraint, only
/// among the tokens it allows (masked before the processors when sampling, so that the warpers see the allowed
/// distribution), told to the constraint. Nil when the constraint allows no token.
func chooseToken(_ scores: inout [Float], processors: [any LogitsProcessor], constraint: (any TokenConstraint)?,
                 history: TokenHistory, sampling: Bool, generator: inout SeededGenerator) -> Int? {
    guard let constraint else {
        for processor in processors { processor.process(&scores, history: history) }
        return sampling ? generator.sample(scores: scores) : argmax(scores)
    }
    let token: Int
    if sampling {
        guard constraint.restrict(&scores) else { return nil }
        for processor in processors { processor.process(&scores, history: history) }
        token = generator.sample(scores: scores)
    } else {
        for processor in processors { processor.process(&scores, history: history) }
        guard let best = constraint.bestAllowed(&scores) else { return nil }
        token = best
    }
    constraint.accept(token)
    return token
}
