/// Why a grammar or a JSON schema cannot constrain generation: one line naming the problem.
public enum GrammarError: Error, Equatable, CustomStringConvertible {
    /// GBNF text that does not parse, names an undefined rule, has no root, or recurses on the left.
    case invalidGrammar(String)
    /// A JSON schema that cannot be turned into a grammar.
    case invalidSchema(String)

    public var description: String {
        switch self {
        case .invalidGrammar(let reason): "invalid grammar: \(reason)"
        case .invalidSchema(let reason): "invalid JSON schema: \(reason)"
        }
    }
}
