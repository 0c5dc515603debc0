/// Why a grammar or a JSON schema cannot constrain generation: one line naming the problem.
public enum GrammarError: Error, Equatable, CustomStringConvertible {
    /// GBNF text that does not parse, names an undefined rule, has no root, or recurses on the left.
    case invalidGrammar(String)
    /// A JSON schema that cannot be turned into a grammar.
    case invalidSchema(String)

    /// The reason on one line: a schema's property names (in the paths llama.cpp's messages give) may hold line
    /// breaks, shown escaped.
    public var description: String {
        switch self {
        case .invalidGrammar(let reason): "invalid grammar: \(Self.oneLine(reason))"
        case .invalidSchema(let reason): "invalid JSON schema: \(Self.oneLine(reason))"
        }
    }

    private static func oneLine(_ text: String) -> String {
        text.replacingOccurrences(of: "\r", with: "\\r").replacingOccurrences(of: "\n", with: "\\n")
    }
}
