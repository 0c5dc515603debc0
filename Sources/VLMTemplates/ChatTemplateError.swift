/// Why a chat template could not be loaded, parsed or rendered.
public enum ChatTemplateError: Error, CustomStringConvertible, Equatable {
    /// The template text is not valid Jinja; `line` and `column` are 1-based.
    case syntax(file: String, line: Int, column: Int, message: String)
    /// Rendering failed (undefined value, type error, exceeded limit…) at a place in the template.
    case render(file: String, line: Int, column: Int, message: String)
    /// The template called `raise_exception(message)`.
    case raised(file: String, message: String)
    /// A JSON file (tokenizer_config.json, chat_template.json) is malformed.
    case invalidJSON(file: String, line: Int, column: Int, message: String)
    /// A file exists but does not hold a chat template in a form transformers accepts.
    case invalidTemplateFile(file: String, message: String)
    /// A file could not be read.
    case unreadable(file: String, message: String)
    /// The conversation's final message cannot be continued (`continue_final_message`), in transformers' words.
    case cannotContinue(file: String, message: String)

    public var description: String {
        switch self {
        case let .syntax(file, line, column, message):
            "\(file):\(line):\(column): template syntax error: \(message)"
        case let .render(file, line, column, message):
            "\(file):\(line):\(column): template error: \(message)"
        case let .raised(file, message):
            "\(file): the template raised an exception: \(message)"
        case let .invalidJSON(file, line, column, message):
            "\(file):\(line):\(column): invalid JSON: \(message)"
        case let .invalidTemplateFile(file, message):
            "\(file): \(message)"
        case let .unreadable(file, message):
            "\(file): cannot read: \(message)"
        case let .cannotContinue(file, message):
            "\(file): \(message)"
        }
    }
}
