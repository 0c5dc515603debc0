/// A constant written in a template.
enum Literal: Sendable {
    case none, bool(Bool), int(Int), double(Double), string(String)
}

/// Arguments of a call, filter or test.
struct Arguments: Sendable {
    var positional: [Expression] = []
    var keyword: [(String, Expression)] = []
    var star: Expression?
    var doubleStar: Expression?
}

/// An expression, with the offset of its first token for error messages.
indirect enum Expression: Sendable {
    case literal(Literal)
    case name(String, at: Int)
    case list([Expression])
    case tuple([Expression])
    case dict([(Expression, Expression)])
    case attribute(Expression, String, at: Int)
    case item(Expression, Expression, at: Int)
    case slice(Expression, start: Expression?, stop: Expression?, step: Expression?, at: Int)
    case call(Expression, Arguments, at: Int)
    case filter(Expression, String, Arguments, at: Int)
    case test(Expression, String, Arguments, negated: Bool, at: Int)
    case unary(String, Expression, at: Int)
    case binary(String, Expression, Expression, at: Int)
    case compare(Expression, [(String, Expression)], at: Int)
    case and(Expression, Expression)
    case or(Expression, Expression)
    case not(Expression)
    case conditional(test: Expression, then: Expression, otherwise: Expression?)
}

/// Where `for` and `set` store values.
indirect enum AssignTarget: Sendable {
    case name(String)
    case tuple([AssignTarget])
    case namespaceAttribute(String, String)
}

/// A statement or piece of output.
indirect enum TemplateNode: Sendable {
    case text(String)
    case output(Expression, at: Int)
    case conditional([(Expression, [TemplateNode])], otherwise: [TemplateNode])
    case loop(Loop)
    case assign(AssignTarget, Expression, at: Int)
    case assignBlock(AssignTarget, filters: [(String, Arguments, Int)], body: [TemplateNode], at: Int)
    case macro(Macro)
    case callBlock(call: Expression, callerParameters: [(String, Expression?)], body: [TemplateNode], at: Int)
    case filterBlock(filters: [(String, Arguments, Int)], body: [TemplateNode], at: Int)
    /// transformers' `{% generation %}`: its body's text, recorded where it lands (``RenderedChat/generations``).
    case generation(body: [TemplateNode])
    case breakLoop, continueLoop
}

struct Loop: Sendable {
    let target: AssignTarget
    let iterable: Expression
    let condition: Expression?
    let recursive: Bool
    let body: [TemplateNode]
    let otherwise: [TemplateNode]
    let offset: Int
}

struct Macro: Sendable {
    let name: String
    let parameters: [(String, Expression?)]
    let body: [TemplateNode]
}
