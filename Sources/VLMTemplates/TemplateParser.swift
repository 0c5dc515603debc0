/// Builds the syntax tree from tokens with jinja2's grammar and operator precedence.
struct TemplateParser {
    private let tokens: [TemplateToken]
    private let lexer: TemplateLexer
    private var index = 0
    /// Bounds the depth of the syntax tree (nested blocks, and chains of operators, filters and attributes, which
    /// nest too), so that neither parsing nor rendering a hostile template can overflow the stack.
    private var depth = 0
    private static let maximumDepth = 200

    init(tokens: [TemplateToken], lexer: TemplateLexer) {
        self.tokens = tokens
        self.lexer = lexer
    }

    mutating func parseTemplate() throws(ChatTemplateError) -> [TemplateNode] {
        let (body, stop) = try parseBody(until: [])
        if let stop { throw failure("unexpected '\(stop)'", at: current.offset) }
        return body
    }

    // MARK: Token helpers

    private var current: TemplateToken { tokens[index] }

    private func failure(_ message: String, at offset: Int) -> ChatTemplateError {
        let (line, column) = lexer.location(of: offset)
        return .syntax(file: lexer.file, line: line, column: column, message: message)
    }

    private func describe(_ kind: TemplateToken.Kind) -> String {
        switch kind {
        case .data: "template data"
        case .variableBegin: "begin of print statement"
        case .variableEnd: "end of print statement"
        case .blockBegin: "begin of statement block"
        case .blockEnd: "end of statement block"
        case let .name(name): "'\(name)'"
        case .string: "string"
        case .integer: "integer"
        case .float: "float"
        case let .op(op): "'\(op)'"
        case .end: "end of template"
        }
    }

    private func isName(_ name: String) -> Bool {
        if case let .name(value) = current.kind { return value == name }
        return false
    }

    private func isOp(_ op: String) -> Bool {
        if case let .op(value) = current.kind { return value == op }
        return false
    }

    private mutating func skipName(_ name: String) -> Bool {
        guard isName(name) else { return false }
        index += 1
        return true
    }

    private mutating func skipOp(_ op: String) -> Bool {
        guard isOp(op) else { return false }
        index += 1
        return true
    }

    private mutating func expectOp(_ op: String) throws(ChatTemplateError) {
        guard skipOp(op) else { throw failure("expected '\(op)', got \(describe(current.kind))", at: current.offset) }
    }

    private mutating func expectName() throws(ChatTemplateError) -> String {
        guard case let .name(name) = current.kind else {
            throw failure("expected a name, got \(describe(current.kind))", at: current.offset)
        }
        index += 1
        return name
    }

    private mutating func expectBlockEnd() throws(ChatTemplateError) {
        guard current.kind == .blockEnd else {
            throw failure("expected end of statement block, got \(describe(current.kind))", at: current.offset)
        }
        index += 1
    }

    private mutating func nest() throws(ChatTemplateError) {
        depth += 1
        if depth > Self.maximumDepth { throw failure("template nested too deeply", at: current.offset) }
    }

    // MARK: Statements

    /// Parses nodes until a block tag whose first name is in `stops` (left unconsumed, returned), or the end.
    private mutating func parseBody(until stops: Set<String>) throws(ChatTemplateError) -> ([TemplateNode], String?) {
        try nest()
        defer { depth -= 1 }
        var body: [TemplateNode] = []
        while true {
            let token = current
            switch token.kind {
            case let .data(text):
                body.append(.text(text))
                index += 1
            case .variableBegin:
                index += 1
                let expression = try parseTuple()
                guard current.kind == .variableEnd else {
                    throw failure("expected end of print statement, got \(describe(current.kind))", at: current.offset)
                }
                index += 1
                body.append(.output(expression, at: token.offset))
            case .blockBegin:
                index += 1
                if case let .name(name) = current.kind, stops.contains(name) {
                    return (body, name)
                }
                if let node = try parseStatement() { body.append(node) }
            case .end:
                return (body, nil)
            default:
                throw failure("unexpected \(describe(token.kind))", at: token.offset)
            }
        }
    }

    /// Parses a body that must end with one of `stops`; consumes the stop name and returns it.
    private mutating func parseBlock(until stops: Set<String>, opener: String, at offset: Int)
        throws(ChatTemplateError) -> ([TemplateNode], String)
    {
        let (body, stop) = try parseBody(until: stops)
        guard let stop else {
            let expected = stops.sorted().map { "'\($0)'" }.joined(separator: " or ")
            throw failure("unexpected end of template: '\(opener)' has no matching \(expected)", at: offset)
        }
        index += 1
        return (body, stop)
    }

    private mutating func parseStatement() throws(ChatTemplateError) -> TemplateNode? {
        let start = current.offset
        guard case let .name(keyword) = current.kind else {
            throw failure("expected a statement name, got \(describe(current.kind))", at: start)
        }
        index += 1
        switch keyword {
        case "for": return try parseFor(at: start)
        case "if": return try parseIf(at: start)
        case "set": return try parseSet(at: start)
        case "macro": return try parseMacro(at: start)
        case "call": return try parseCall(at: start)
        case "filter":
            let filters = try parseFilterChain()
            try expectBlockEnd()
            let (body, _) = try parseBlock(until: ["endfilter"], opener: "filter", at: start)
            try expectBlockEnd()
            return .filterBlock(filters: filters, body: body, at: start)
        case "generation":
            // transformers' extension marking the assistant's text for masks.
            try expectBlockEnd()
            let (body, _) = try parseBlock(until: ["endgeneration"], opener: "generation", at: start)
            try expectBlockEnd()
            return .generation(body: body)
        case "print":
            let expression = try parseTuple()
            try expectBlockEnd()
            return .output(expression, at: start)
        case "break", "continue":
            try expectBlockEnd()
            return keyword == "break" ? .breakLoop : .continueLoop
        default:
            throw failure("unknown tag '\(keyword)'", at: start)
        }
    }

    private mutating func parseFor(at start: Int) throws(ChatTemplateError) -> TemplateNode {
        let target = try parseAssignTarget(allowNamespace: false, stopNames: ["in"])
        guard skipName("in") else { throw failure("expected 'in' in a for loop", at: current.offset) }
        let iterable = try parseTuple(conditional: false, stopNames: ["recursive"])
        var condition: Expression?
        if skipName("if") { condition = try parseExpression() }
        let recursive = skipName("recursive")
        try expectBlockEnd()
        let (body, stop) = try parseBlock(until: ["endfor", "else"], opener: "for", at: start)
        try expectBlockEnd()
        var otherwise: [TemplateNode] = []
        if stop == "else" {
            (otherwise, _) = try parseBlock(until: ["endfor"], opener: "for", at: start)
            try expectBlockEnd()
        }
        return .loop(Loop(target: target, iterable: iterable, condition: condition, recursive: recursive, body: body,
                          otherwise: otherwise, offset: start))
    }

    private mutating func parseIf(at start: Int) throws(ChatTemplateError) -> TemplateNode {
        var branches: [(Expression, [TemplateNode])] = []
        var test = try parseTuple(conditional: false)
        while true {
            try expectBlockEnd()
            let (body, stop) = try parseBlock(until: ["elif", "else", "endif"], opener: "if", at: start)
            branches.append((test, body))
            switch stop {
            case "elif":
                test = try parseTuple(conditional: false)
            case "else":
                try expectBlockEnd()
                let (otherwise, _) = try parseBlock(until: ["endif"], opener: "if", at: start)
                try expectBlockEnd()
                return .conditional(branches, otherwise: otherwise)
            default:
                try expectBlockEnd()
                return .conditional(branches, otherwise: [])
            }
        }
    }

    private mutating func parseSet(at start: Int) throws(ChatTemplateError) -> TemplateNode {
        let target = try parseAssignTarget(allowNamespace: true, stopNames: [])
        if skipOp("=") {
            let value = try parseTuple()
            try expectBlockEnd()
            return .assign(target, value, at: start)
        }
        let filters = skipOp("|") ? try parseFilterChain() : []
        try expectBlockEnd()
        let (body, _) = try parseBlock(until: ["endset"], opener: "set", at: start)
        try expectBlockEnd()
        return .assignBlock(target, filters: filters, body: body, at: start)
    }

    private mutating func parseFilterChain() throws(ChatTemplateError) -> [(String, Arguments, Int)] {
        var filters: [(String, Arguments, Int)] = []
        repeat {
            let offset = current.offset
            let name = try parseDottedName()
            let arguments = isOp("(") ? try parseCallArguments() : Arguments()
            filters.append((name, arguments, offset))
        } while skipOp("|")
        return filters
    }

    private mutating func parseSignature() throws(ChatTemplateError) -> [(String, Expression?)] {
        var parameters: [(String, Expression?)] = []
        try expectOp("(")
        while !isOp(")") {
            if !parameters.isEmpty { try expectOp(",") }
            if isOp(")") { break }
            let name = try expectName()
            parameters.append((name, skipOp("=") ? try parseExpression() : nil))
        }
        try expectOp(")")
        return parameters
    }

    private mutating func parseMacro(at start: Int) throws(ChatTemplateError) -> TemplateNode {
        let name = try expectName()
        let parameters = try parseSignature()
        try expectBlockEnd()
        let (body, _) = try parseBlock(until: ["endmacro"], opener: "macro", at: start)
        try expectBlockEnd()
        return .macro(Macro(name: name, parameters: parameters, body: body))
    }

    private mutating func parseCall(at start: Int) throws(ChatTemplateError) -> TemplateNode {
        let callerParameters = isOp("(") ? try parseSignature() : []
        let call = try parseExpression()
        guard case .call = call else { throw failure("expected a call after 'call'", at: start) }
        try expectBlockEnd()
        let (body, _) = try parseBlock(until: ["endcall"], opener: "call", at: start)
        try expectBlockEnd()
        return .callBlock(call: call, callerParameters: callerParameters, body: body, at: start)
    }

    private mutating func parseAssignTarget(allowNamespace: Bool, stopNames: Set<String>)
        throws(ChatTemplateError) -> AssignTarget
    {
        var targets: [AssignTarget] = []
        var isTuple = false
        while true {
            if !targets.isEmpty { try expectOp(",") }
            if case let .name(name) = current.kind, stopNames.contains(name) { break }
            if current.kind == .blockEnd || isOp("=") || isOp("|") { break }
            let offset = current.offset
            let name = try expectName()
            if ["true", "false", "True", "False", "none", "None"].contains(name) {
                throw failure("can't assign to '\(name)'", at: offset)
            }
            if allowNamespace, skipOp(".") {
                targets.append(.namespaceAttribute(name, try expectName()))
            } else {
                targets.append(.name(name))
            }
            guard isOp(",") else { break }
            isTuple = true
        }
        guard let first = targets.first else { throw failure("expected an assignment target", at: current.offset) }
        return isTuple ? .tuple(targets) : first
    }

    // MARK: Expressions

    /// A comma-separated list becomes a tuple; a single expression stays as it is.
    private mutating func parseTuple(conditional: Bool = true, stopNames: Set<String> = [],
                                     parenthesized: Bool = false) throws(ChatTemplateError) -> Expression
    {
        var elements: [Expression] = []
        var isTuple = false
        while true {
            if !elements.isEmpty { try expectOp(",") }
            if isTupleEnd(stopNames) { break }
            elements.append(conditional ? try parseExpression() : try parseOr())
            guard isOp(",") else { break }
            isTuple = true
        }
        if !isTuple {
            if let first = elements.first { return first }
            guard parenthesized else { throw failure("expected an expression, got \(describe(current.kind))", at: current.offset) }
        }
        return .tuple(elements)
    }

    private func isTupleEnd(_ stopNames: Set<String>) -> Bool {
        switch current.kind {
        case .variableEnd, .blockEnd, .end: return true
        case .op(")"): return true
        case let .name(name): return stopNames.contains(name)
        default: return false
        }
    }

    private mutating func parseExpression() throws(ChatTemplateError) -> Expression {
        try nest()
        defer { depth -= 1 }
        var expression = try parseOr()
        while skipName("if") {
            let test = try parseOr()
            let otherwise = skipName("else") ? try parseExpression() : nil
            expression = .conditional(test: test, then: expression, otherwise: otherwise)
        }
        return expression
    }

    private mutating func parseOr() throws(ChatTemplateError) -> Expression {
        let savedDepth = depth
        defer { depth = savedDepth }
        var left = try parseAnd()
        while skipName("or") {
            try nest()
            left = .or(left, try parseAnd())
        }
        return left
    }

    private mutating func parseAnd() throws(ChatTemplateError) -> Expression {
        let savedDepth = depth
        defer { depth = savedDepth }
        var left = try parseNot()
        while skipName("and") {
            try nest()
            left = .and(left, try parseNot())
        }
        return left
    }

    private mutating func parseNot() throws(ChatTemplateError) -> Expression {
        if skipName("not") {
            try nest()
            defer { depth -= 1 }
            return .not(try parseNot())
        }
        return try parseCompare()
    }

    private mutating func parseCompare() throws(ChatTemplateError) -> Expression {
        let offset = current.offset
        let first = try parseMath1()
        var operations: [(String, Expression)] = []
        let savedDepth = depth
        defer { depth = savedDepth }
        while true {
            try nest()
            if case let .op(op) = current.kind, ["==", "!=", "<", "<=", ">", ">="].contains(op) {
                index += 1
                operations.append((op, try parseMath1()))
            } else if skipName("in") {
                operations.append(("in", try parseMath1()))
            } else if isName("not"), index + 1 < tokens.count, tokens[index + 1].kind == .name("in") {
                index += 2
                operations.append(("not in", try parseMath1()))
            } else {
                break
            }
        }
        return operations.isEmpty ? first : .compare(first, operations, at: offset)
    }

    private mutating func parseBinaryLevel(_ ops: Set<String>, next: (inout TemplateParser) throws(ChatTemplateError) -> Expression)
        throws(ChatTemplateError) -> Expression
    {
        let savedDepth = depth
        defer { depth = savedDepth }
        var left = try next(&self)
        while case let .op(op) = current.kind, ops.contains(op) {
            let offset = current.offset
            try nest()
            index += 1
            left = .binary(op, left, try next(&self), at: offset)
        }
        return left
    }

    private mutating func parseMath1() throws(ChatTemplateError) -> Expression {
        try parseBinaryLevel(["+", "-"]) { (parser: inout TemplateParser) throws(ChatTemplateError) in try parser.parseConcat() }
    }

    private mutating func parseConcat() throws(ChatTemplateError) -> Expression {
        try parseBinaryLevel(["~"]) { (parser: inout TemplateParser) throws(ChatTemplateError) in try parser.parseMath2() }
    }

    private mutating func parseMath2() throws(ChatTemplateError) -> Expression {
        try parseBinaryLevel(["*", "/", "//", "%"]) { (parser: inout TemplateParser) throws(ChatTemplateError) in try parser.parsePow() }
    }

    private mutating func parsePow() throws(ChatTemplateError) -> Expression {
        try parseBinaryLevel(["**"]) { (parser: inout TemplateParser) throws(ChatTemplateError) in try parser.parseUnary() }
    }

    private mutating func parseUnary(withFilter: Bool = true) throws(ChatTemplateError) -> Expression {
        try nest()
        defer { depth -= 1 }
        let offset = current.offset
        var expression: Expression
        if skipOp("-") {
            expression = .unary("-", try parseUnary(withFilter: false), at: offset)
        } else if skipOp("+") {
            expression = .unary("+", try parseUnary(withFilter: false), at: offset)
        } else {
            expression = try parsePostfix(try parsePrimary())
        }
        return withFilter ? try parseFilterExpression(expression) : expression
    }

    private mutating func parsePrimary() throws(ChatTemplateError) -> Expression {
        let token = current
        switch token.kind {
        case let .name(name):
            index += 1
            switch name {
            case "true", "True": return .literal(.bool(true))
            case "false", "False": return .literal(.bool(false))
            case "none", "None": return .literal(.none)
            default: return .name(name, at: token.offset)
            }
        case let .string(text):
            index += 1
            var joined = text
            while case let .string(more) = current.kind {
                joined += more
                index += 1
            }
            return .literal(.string(joined))
        case let .integer(value):
            index += 1
            return .literal(.int(value))
        case let .float(value):
            index += 1
            return .literal(.double(value))
        case .op("("):
            index += 1
            let expression = try parseTuple(parenthesized: true)
            try expectOp(")")
            return expression
        case .op("["):
            index += 1
            var elements: [Expression] = []
            while !isOp("]") {
                if !elements.isEmpty { try expectOp(",") }
                if isOp("]") { break }
                elements.append(try parseExpression())
            }
            try expectOp("]")
            return .list(elements)
        case .op("{"):
            index += 1
            var pairs: [(Expression, Expression)] = []
            while !isOp("}") {
                if !pairs.isEmpty { try expectOp(",") }
                if isOp("}") { break }
                let key = try parseExpression()
                try expectOp(":")
                pairs.append((key, try parseExpression()))
            }
            try expectOp("}")
            return .dict(pairs)
        default:
            throw failure("unexpected \(describe(token.kind))", at: token.offset)
        }
    }

    private mutating func parsePostfix(_ base: Expression) throws(ChatTemplateError) -> Expression {
        let savedDepth = depth
        defer { depth = savedDepth }
        var expression = base
        while true {
            let offset = current.offset
            try nest()
            if skipOp(".") {
                switch current.kind {
                case let .name(name):
                    index += 1
                    expression = .attribute(expression, name, at: offset)
                case let .integer(value):
                    index += 1
                    expression = .item(expression, .literal(.int(value)), at: offset)
                default:
                    throw failure("expected an attribute name after '.'", at: current.offset)
                }
            } else if skipOp("[") {
                expression = try parseSubscript(expression, at: offset)
            } else if isOp("(") {
                expression = .call(expression, try parseCallArguments(), at: offset)
            } else {
                return expression
            }
        }
    }

    private mutating func parseSubscript(_ base: Expression, at offset: Int) throws(ChatTemplateError) -> Expression {
        var subscripts: [Expression] = []
        while !isOp("]") {
            if !subscripts.isEmpty { try expectOp(",") }
            if isOp("]") { break }
            var start: Expression?
            if !isOp(":") {
                start = try parseExpression()
                guard isOp(":") else {
                    subscripts.append(start!)
                    continue
                }
            }
            index += 1
            let stop = isOp("]") || isOp(",") || isOp(":") ? nil : try parseExpression()
            var step: Expression?
            if skipOp(":"), !isOp("]"), !isOp(",") { step = try parseExpression() }
            subscripts.append(.slice(base, start: start, stop: stop, step: step, at: offset))
        }
        try expectOp("]")
        guard subscripts.count == 1 else {
            throw failure("tuple subscripts are not supported", at: offset)
        }
        if case .slice = subscripts[0] { return subscripts[0] }
        return .item(base, subscripts[0], at: offset)
    }

    private mutating func parseCallArguments() throws(ChatTemplateError) -> Arguments {
        try expectOp("(")
        var arguments = Arguments()
        var first = true
        while !isOp(")") {
            if !first { try expectOp(",") }
            first = false
            if isOp(")") { break }
            if skipOp("*") {
                arguments.star = try parseExpression()
            } else if skipOp("**") {
                arguments.doubleStar = try parseExpression()
            } else if case let .name(name) = current.kind, index + 1 < tokens.count, tokens[index + 1].kind == .op("=") {
                index += 2
                arguments.keyword.append((name, try parseExpression()))
            } else {
                if !arguments.keyword.isEmpty || arguments.star != nil {
                    throw failure("positional argument after a keyword argument", at: current.offset)
                }
                arguments.positional.append(try parseExpression())
            }
        }
        try expectOp(")")
        return arguments
    }

    private mutating func parseDottedName() throws(ChatTemplateError) -> String {
        var name = try expectName()
        while skipOp(".") { name += "." + (try expectName()) }
        return name
    }

    private mutating func parseFilterExpression(_ base: Expression) throws(ChatTemplateError) -> Expression {
        let savedDepth = depth
        defer { depth = savedDepth }
        var expression = base
        while true {
            let offset = current.offset
            try nest()
            if skipOp("|") {
                let name = try parseDottedName()
                let arguments = isOp("(") ? try parseCallArguments() : Arguments()
                expression = .filter(expression, name, arguments, at: offset)
            } else if skipName("is") {
                let negated = skipName("not")
                let name = try parseDottedName()
                var arguments = Arguments()
                if isOp("(") {
                    arguments = try parseCallArguments()
                } else if startsTestArgument {
                    if isName("is") { throw failure("you cannot chain multiple tests with 'is'", at: current.offset) }
                    arguments.positional = [try parsePostfix(try parsePrimary())]
                }
                expression = .test(expression, name, arguments, negated: negated, at: offset)
            } else if isOp("(") {
                expression = .call(expression, try parseCallArguments(), at: offset)
            } else {
                return expression
            }
        }
    }

    private var startsTestArgument: Bool {
        switch current.kind {
        case let .name(name): !["else", "or", "and"].contains(name)
        case .string, .integer, .float, .op("("), .op("["), .op("{"): true
        default: false
        }
    }
}
