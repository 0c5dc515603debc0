import Foundation

/// Variables visible at one level: the template, a loop iteration, a macro call.
final class Scope {
    var variables: [String: Value] = [:]
    let parent: Scope?

    init(parent: Scope?) {
        self.parent = parent
    }

    func lookup(_ name: String) -> Value? {
        var scope: Scope? = self
        while let current = scope {
            if let value = current.variables[name] { return value }
            scope = current.parent
        }
        return nil
    }
}

/// The objects of one render that can come to hold themselves: scopes captured by the macros, call blocks and
/// loops made in them (a macro is stored in the scope it captures), and namespaces (a template may store one in
/// itself). Reference counting never frees such a cycle, so every render would leak its macros and their syntax
/// trees; the render clears these objects when it ends instead.
final class RenderReferences {
    private var scopes: [Scope] = []
    private var namespaces: [Namespace] = []

    func captured(_ scope: Scope) { scopes.append(scope) }
    func created(_ namespace: Namespace) { namespaces.append(namespace) }

    /// Empties every object the render made that could be in a cycle; the render must be over.
    func release() {
        for scope in scopes { scope.variables.removeAll() }
        for namespace in namespaces { namespace.attributes.removeAll() }
        scopes.removeAll()
        namespaces.removeAll()
    }
}

/// Runs a parsed template. Limits bound output size, loop iterations and macro recursion, so that no template can
/// hang the caller or allocate without bound.
struct Interpreter {
    static let maximumOutputBytes = 64 << 20
    static let maximumIterations = 1_000_000
    static let maximumCallDepth = 100
    /// jinja2's sandbox refuses ranges longer than this.
    static let maximumRange = 100_000
    /// Strings and lists built by `*`, `join` and the like may not exceed this many elements.
    static let maximumBuiltSize = 16 << 20

    let file: String
    let lexer: TemplateLexer
    let references = RenderReferences()
    var offset = 0
    private var iterations = 0
    private var callDepth = 0
    /// How many captures (macro calls, `set` and `filter` blocks, recursive loops) the output now goes into; 0 at the
    /// template's own output.
    private var captureDepth = 0
    /// Unicode scalars of the template's own output so far: what jinja2 has yielded of it.
    private var yieldedScalars = 0
    /// Where each `{% generation %}` block's text lands, as transformers' AssistantTracker records it: from the
    /// length of the output yielded when the block ends, for the length of its text. Inside a capture that is the
    /// output before the capture, as in jinja2.
    var generations: [Range<Int>] = []

    init(file: String, lexer: TemplateLexer) {
        self.file = file
        self.lexer = lexer
    }

    func error(_ message: String) -> ChatTemplateError {
        let (line, column) = lexer.location(of: offset)
        return .render(file: file, line: line, column: column, message: message)
    }

    enum Flow { case normal, breakLoop, continueLoop }

    // MARK: Statements

    mutating func render(_ nodes: [TemplateNode], in scope: Scope, into output: inout String) throws(ChatTemplateError) -> Flow {
        for node in nodes {
            switch node {
            case let .text(text):
                try append(text, to: &output)
            case let .output(expression, at):
                offset = at
                let value = try evaluate(expression, in: scope)
                try append(value.pythonString, to: &output)
            case let .conditional(branches, otherwise):
                var chosen = otherwise
                for (test, body) in branches where try evaluate(test, in: scope).isTruthy {
                    chosen = body
                    break
                }
                let flow = try render(chosen, in: scope, into: &output)
                if flow != .normal { return flow }
            case let .loop(loop):
                offset = loop.offset
                let iterable = try evaluate(loop.iterable, in: scope)
                try runLoop(loop, over: iterable, depth0: 0, in: scope, into: &output)
            case let .assign(target, expression, at):
                offset = at
                let value = try evaluate(expression, in: scope)
                offset = at
                try assign(value, to: target, in: scope)
            case let .assignBlock(target, filters, body, at):
                let text = try capture(body, in: scope)
                offset = at
                try assign(try applyFilters(filters, to: .string(text), in: scope), to: target, in: scope)
            case let .macro(macro):
                scope.variables[macro.name] = makeMacro(macro, definedIn: scope)
            case let .callBlock(call, callerParameters, body, at):
                offset = at
                guard case let .call(function, arguments, callOffset) = call else { continue }
                let caller = makeMacro(Macro(name: "caller", parameters: callerParameters, body: body), definedIn: scope)
                var evaluated = try evaluateArguments(arguments, in: scope, at: callOffset)
                evaluated.keyword.append(("caller", caller))
                let result = try invoke(try evaluate(function, in: scope), evaluated)
                try append(result.pythonString, to: &output)
            case let .filterBlock(filters, body, at):
                let text = try capture(body, in: scope)
                offset = at
                try append(try applyFilters(filters, to: .string(text), in: scope).pythonString, to: &output)
            case let .generation(body):
                let text = try capture(body, in: scope)
                generations.append(yieldedScalars..<(yieldedScalars + text.unicodeScalars.count))
                try append(text, to: &output)
            case .breakLoop:
                return .breakLoop
            case .continueLoop:
                return .continueLoop
            }
        }
        return .normal
    }

    /// `nodes` rendered into a string of their own.
    private mutating func capture(_ nodes: [TemplateNode], in scope: Scope) throws(ChatTemplateError) -> String {
        captureDepth += 1
        defer { captureDepth -= 1 }
        var text = ""
        _ = try render(nodes, in: scope, into: &text)
        return text
    }

    private mutating func append(_ text: String, to output: inout String) throws(ChatTemplateError) {
        if captureDepth == 0 { yieldedScalars += text.unicodeScalars.count }
        output += text
        if output.utf8.count > Self.maximumOutputBytes {
            throw error("output exceeds \(Self.maximumOutputBytes) bytes")
        }
    }

    private mutating func applyFilters(_ filters: [(String, Arguments, Int)], to value: Value, in scope: Scope)
        throws(ChatTemplateError) -> Value
    {
        var result = value
        for (name, arguments, at) in filters {
            let evaluated = try evaluateArguments(arguments, in: scope, at: at)
            offset = at
            result = try applyFilter(name, to: result, evaluated)
        }
        return result
    }

    mutating func iterate(_ value: Value) throws(ChatTemplateError) -> [Value] {
        switch value {
        case .undefined: return []
        case let .list(values), let .tuple(values): return values
        case let .dict(pairs): return pairs.map(\.0)
        // Markup does not override str's iteration, so its characters are plain strings.
        case let .string(text), let .markup(text): return text.unicodeScalars.map { .string(String($0)) }
        case let .namespace(namespace): return namespace.attributes.map { .string($0.0) }
        case let .generator(generator):
            var items: [Value] = []
            while let item = try generator.next(&self) { items.append(item) }
            return items
        default: throw error("'\(value.typeName)' object is not iterable")
        }
    }

    mutating func countIteration() throws(ChatTemplateError) {
        iterations += 1
        if iterations > Self.maximumIterations {
            throw error("template runs more than \(Self.maximumIterations) loop iterations")
        }
    }

    private mutating func runLoop(_ loop: Loop, over iterable: Value, depth0: Int, in scope: Scope, into output: inout String)
        throws(ChatTemplateError)
    {
        var source = try cursor(over: iterable)
        if let condition = loop.condition {
            // jinja2 filters the iterable lazily too, so the condition runs only for the items the loop reaches.
            references.captured(scope)
            let filtered = makeGenerator("<genexpr>", body: { _ in iterable }) { (interpreter: inout Interpreter, item: Value) throws(ChatTemplateError) in
                let filterScope = Scope(parent: scope)
                try interpreter.assign(item, to: loop.target, in: filterScope)
                return try interpreter.evaluate(condition, in: filterScope).isTruthy ? item : nil
            }
            source = try cursor(over: filtered)
        }
        var recurse: Value?
        if loop.recursive {
            references.captured(scope)
            recurse = .callable(Callable(name: "loop") { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
                guard let nested = arguments.positional.first else { throw interpreter.error("loop() takes an iterable") }
                interpreter.captureDepth += 1
                defer { interpreter.captureDepth -= 1 }
                var text = ""
                try interpreter.runLoop(loop, over: nested, depth0: depth0 + 1, in: scope, into: &text)
                return .string(text)
            })
        }
        let state = LoopState(source: source, depth0: depth0, recurse: recurse)
        var index = 0
        while let item = try state.item(at: index, &self) {
            try countIteration()
            state.index0 = index
            let iterationScope = Scope(parent: scope)
            offset = loop.offset
            try assign(item, to: loop.target, in: iterationScope)
            iterationScope.variables["loop"] = .loop(state)
            if try render(loop.body, in: iterationScope, into: &output) == .breakLoop { break }
            index += 1
        }
        if state.items.isEmpty {
            _ = try render(loop.otherwise, in: scope, into: &output)
        }
    }

    private mutating func assign(_ value: Value, to target: AssignTarget, in scope: Scope) throws(ChatTemplateError) {
        switch target {
        case let .name(name):
            scope.variables[name] = value
        case let .namespaceAttribute(name, attribute):
            guard case let .namespace(namespace) = scope.lookup(name) else {
                throw error("can only set attribute on namespace objects, and '\(name)' is not one")
            }
            guard !attribute.hasPrefix("_") else {
                throw error("chat templates cannot store underscore-prefixed attributes on a namespace, but got '\(attribute)'")
            }
            namespace[attribute] = value
        case let .tuple(targets):
            let values = try iterate(value)
            guard values.count == targets.count else {
                throw error(values.count > targets.count
                    ? "too many values to unpack (expected \(targets.count))"
                    : "not enough values to unpack (expected \(targets.count), got \(values.count))")
            }
            for (element, target) in zip(values, targets) { try assign(element, to: target, in: scope) }
        }
    }

    private func makeMacro(_ macro: Macro, definedIn scope: Scope) -> Value {
        references.captured(scope)
        return .callable(Callable(name: macro.name) { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
            try interpreter.callMacro(macro, definedIn: scope, arguments)
        })
    }

    private mutating func callMacro(_ macro: Macro, definedIn scope: Scope, _ arguments: CallArguments)
        throws(ChatTemplateError) -> Value
    {
        guard callDepth < Self.maximumCallDepth else {
            throw error("macro calls nested deeper than \(Self.maximumCallDepth)")
        }
        callDepth += 1
        defer { callDepth -= 1 }
        let macroScope = Scope(parent: scope)
        var keyword = arguments.keyword
        for (index, (name, defaultValue)) in macro.parameters.enumerated() {
            if let position = keyword.firstIndex(where: { $0.0 == name }) {
                if index < arguments.positional.count {
                    throw error("macro '\(macro.name)' got multiple values for argument '\(name)'")
                }
                macroScope.variables[name] = keyword.remove(at: position).1
            } else if index < arguments.positional.count {
                macroScope.variables[name] = arguments.positional[index]
            } else if let defaultValue {
                macroScope.variables[name] = try evaluate(defaultValue, in: macroScope)
            } else {
                macroScope.variables[name] = .undefined("parameter '\(name)' was not provided")
            }
        }
        if let position = keyword.firstIndex(where: { $0.0 == "caller" }) {
            macroScope.variables["caller"] = keyword.remove(at: position).1
        }
        if arguments.positional.count > macro.parameters.count {
            macroScope.variables["varargs"] = .tuple(Array(arguments.positional[macro.parameters.count...]))
        } else {
            macroScope.variables["varargs"] = .tuple([])
        }
        macroScope.variables["kwargs"] = .dict(keyword.map { (.string($0.0), $0.1) })
        return .string(try capture(macro.body, in: macroScope))
    }

    // MARK: Expressions

    mutating func evaluate(_ expression: Expression, in scope: Scope) throws(ChatTemplateError) -> Value {
        switch expression {
        case let .literal(literal):
            return Value(literal)
        case let .name(name, at):
            if let value = scope.lookup(name) { return value }
            offset = at
            return .undefined("'\(name)' is undefined")
        case let .list(elements):
            var values: [Value] = []
            for element in elements { values.append(try evaluate(element, in: scope)) }
            return .list(values)
        case let .tuple(elements):
            var values: [Value] = []
            for element in elements { values.append(try evaluate(element, in: scope)) }
            return .tuple(values)
        case let .dict(pairs):
            var result: [(Value, Value)] = []
            for (keyExpression, valueExpression) in pairs {
                let key = try evaluate(keyExpression, in: scope)
                let value = try evaluate(valueExpression, in: scope)
                if let index = result.firstIndex(where: { $0.0.pythonEquals(key) }) {
                    result[index].1 = value
                } else {
                    result.append((key, value))
                }
            }
            return .dict(result)
        case let .attribute(base, name, at):
            let object = try evaluate(base, in: scope)
            offset = at
            return try attribute(name, of: object)
        case let .item(base, keyExpression, at):
            let object = try evaluate(base, in: scope)
            let key = try evaluate(keyExpression, in: scope)
            offset = at
            return try item(key, of: object)
        case let .slice(base, start, stop, step, at):
            let object = try evaluate(base, in: scope)
            let startValue = try start.map { (e) throws(ChatTemplateError) in try evaluate(e, in: scope) }
            let stopValue = try stop.map { (e) throws(ChatTemplateError) in try evaluate(e, in: scope) }
            let stepValue = try step.map { (e) throws(ChatTemplateError) in try evaluate(e, in: scope) }
            offset = at
            return try slice(object, startValue, stopValue, stepValue)
        case let .call(function, arguments, at):
            let callee = try evaluate(function, in: scope)
            let evaluated = try evaluateArguments(arguments, in: scope, at: at)
            offset = at
            return try invoke(callee, evaluated)
        case let .filter(base, name, arguments, at):
            let value = try evaluate(base, in: scope)
            let evaluated = try evaluateArguments(arguments, in: scope, at: at)
            offset = at
            return try applyFilter(name, to: value, evaluated)
        case let .test(base, name, arguments, negated, at):
            let value = try evaluate(base, in: scope)
            let evaluated = try evaluateArguments(arguments, in: scope, at: at)
            offset = at
            return .bool(try applyTest(name, to: value, evaluated) != negated)
        case let .unary(op, operand, at):
            let value = try evaluate(operand, in: scope)
            offset = at
            return try unary(op, value)
        case let .binary(op, left, right, at):
            let leftValue = try evaluate(left, in: scope)
            let rightValue = try evaluate(right, in: scope)
            offset = at
            return try binary(op, leftValue, rightValue)
        case let .compare(first, operations, at):
            var left = try evaluate(first, in: scope)
            for (op, rightExpression) in operations {
                let right = try evaluate(rightExpression, in: scope)
                offset = at
                guard try compare(op, left, right) else { return .bool(false) }
                left = right
            }
            return .bool(true)
        case let .and(left, right):
            let leftValue = try evaluate(left, in: scope)
            return leftValue.isTruthy ? try evaluate(right, in: scope) : leftValue
        case let .or(left, right):
            let leftValue = try evaluate(left, in: scope)
            return leftValue.isTruthy ? leftValue : try evaluate(right, in: scope)
        case let .not(operand):
            return .bool(!(try evaluate(operand, in: scope).isTruthy))
        case let .conditional(test, then, otherwise):
            if try evaluate(test, in: scope).isTruthy { return try evaluate(then, in: scope) }
            guard let otherwise else { return .undefined("the inline if expression evaluated to false and no else section was defined") }
            return try evaluate(otherwise, in: scope)
        }
    }

    mutating func evaluateArguments(_ arguments: Arguments, in scope: Scope, at: Int) throws(ChatTemplateError) -> CallArguments {
        var result = CallArguments(offset: at)
        for expression in arguments.positional { result.positional.append(try evaluate(expression, in: scope)) }
        for (name, expression) in arguments.keyword { result.keyword.append((name, try evaluate(expression, in: scope))) }
        if let star = arguments.star {
            result.positional += try iterate(try evaluate(star, in: scope))
        }
        if let doubleStar = arguments.doubleStar {
            guard case let .dict(pairs) = try evaluate(doubleStar, in: scope) else {
                offset = at
                throw error("argument after ** must be a mapping")
            }
            for (key, value) in pairs {
                guard case let .string(name) = key else { throw error("keywords must be strings") }
                result.keyword.append((name, value))
            }
        }
        return result
    }

    mutating func invoke(_ callee: Value, _ arguments: CallArguments) throws(ChatTemplateError) -> Value {
        switch callee {
        case let .callable(callable):
            return try callable.call(&self, arguments)
        case let .loop(state):
            guard let recurse = state.recurse, case let .callable(callable) = recurse else {
                throw error("the loop is not recursive; add 'recursive' to the for statement to call loop()")
            }
            return try callable.call(&self, arguments)
        case let .undefined(undefined):
            throw error(undefined.message)
        default:
            throw error("'\(callee.typeName)' object is not callable")
        }
    }

    /// jinja2's `getattr`: an attribute (a method) first, then an item.
    mutating func attribute(_ name: String, of object: Value) throws(ChatTemplateError) -> Value {
        if case let .undefined(undefined) = object { throw error(undefined.message) }
        if name.hasPrefix("_") {
            return .undefined("access to attribute '\(name)' of '\(object.typeName)' object is unsafe.")
        }
        switch object {
        case let .namespace(namespace):
            return namespace[name] ?? .undefined("'\(object.typeName) object' has no attribute '\(name)'")
        case let .loop(state):
            return try loopAttribute(name, state)
        default:
            if let method = method(name, of: object) { return method }
            if case .dict = object, let value = object.lookup(.string(name)) { return value }
            return .undefined("'\(object.typeName) object' has no attribute '\(name)'")
        }
    }

    /// jinja2's `getitem`: an item first, then an attribute for string keys.
    mutating func item(_ key: Value, of object: Value) throws(ChatTemplateError) -> Value {
        if case let .undefined(undefined) = object { throw error(undefined.message) }
        switch object {
        case .dict:
            if let value = object.lookup(key) { return value }
        case let .list(values), let .tuple(values):
            if let index = key.integer {
                let resolved = index < 0 ? index + values.count : index
                if resolved >= 0, resolved < values.count { return values[resolved] }
                return .undefined("'\(object.typeName) object' has no attribute \(index)")
            }
        case let .string(text), let .markup(text):
            if let index = key.integer {
                let scalars = Array(text.unicodeScalars)
                let resolved = index < 0 ? index + scalars.count : index
                if resolved >= 0, resolved < scalars.count { return object.sameStringKind(String(scalars[resolved])) }
                return .undefined("'\(object.typeName) object' has no attribute \(index)")
            }
        default:
            break
        }
        if let name = key.stringContent { return try attribute(name, of: object) }
        if case let .undefined(undefined) = key { throw error(undefined.message) }
        return .undefined("'\(object.typeName) object' has no attribute \(key.pythonRepr)")
    }

    private mutating func loopAttribute(_ name: String, _ state: LoopState) throws(ChatTemplateError) -> Value {
        let index0 = state.index0
        switch name {
        case "index": return .int(index0 + 1)
        case "index0": return .int(index0)
        case "revindex": return .int(try state.length(&self) - index0)
        case "revindex0": return .int(try state.length(&self) - index0 - 1)
        case "first": return .bool(index0 == 0)
        case "last": return .bool(try state.item(at: index0 + 1, &self) == nil)
        case "length": return .int(try state.length(&self))
        case "depth": return .int(state.depth0 + 1)
        case "depth0": return .int(state.depth0)
        case "previtem": return index0 > 0 ? state.items[index0 - 1] : .undefined("there is no previous item")
        case "nextitem": return try state.item(at: index0 + 1, &self) ?? .undefined("there is no next item")
        case "cycle":
            return .callable(Callable(name: "cycle") { (interpreter: inout Interpreter, arguments: CallArguments) throws(ChatTemplateError) in
                guard !arguments.positional.isEmpty else { throw interpreter.error("no items for cycling given") }
                return arguments.positional[index0 % arguments.positional.count]
            })
        default:
            return .undefined("'LoopContext object' has no attribute '\(name)'")
        }
    }

    private func pythonSliceIndices(count: Int, _ start: Value?, _ stop: Value?, _ step: Value?) throws(ChatTemplateError) -> [Int] {
        func integer(_ value: Value?) throws(ChatTemplateError) -> Int? {
            guard let value, !value.isUndefined else { return nil }
            if case .none = value { return nil }
            guard let integer = value.integer else { throw error("slice indices must be integers or None") }
            return integer
        }
        let stepValue = try integer(step) ?? 1
        guard stepValue != 0 else { throw error("slice step cannot be zero") }
        func clamp(_ value: Int?, _ defaultValue: Int, lower: Int, upper: Int) -> Int {
            guard var value else { return defaultValue }
            if value < 0 { value += count }
            return min(max(value, lower), upper)
        }
        var indices: [Int] = []
        if stepValue > 0 {
            var index = clamp(try integer(start), 0, lower: 0, upper: count)
            let end = clamp(try integer(stop), count, lower: 0, upper: count)
            while index < end {
                indices.append(index)
                index += stepValue
            }
        } else {
            var index = clamp(try integer(start), count - 1, lower: -1, upper: count - 1)
            let end = clamp(try integer(stop), -1, lower: -1, upper: count - 1)
            while index > end {
                indices.append(index)
                index += stepValue
            }
        }
        return indices
    }

    private func slice(_ object: Value, _ start: Value?, _ stop: Value?, _ step: Value?) throws(ChatTemplateError) -> Value {
        switch object {
        case let .list(values):
            return .list(try pythonSliceIndices(count: values.count, start, stop, step).map { values[$0] })
        case let .tuple(values):
            return .tuple(try pythonSliceIndices(count: values.count, start, stop, step).map { values[$0] })
        case let .string(text), let .markup(text):
            let scalars = Array(text.unicodeScalars)
            var result = String.UnicodeScalarView()
            for index in try pythonSliceIndices(count: scalars.count, start, stop, step) { result.append(scalars[index]) }
            return object.sameStringKind(String(result))
        case let .undefined(undefined):
            throw error(undefined.message)
        default:
            throw error("'\(object.typeName)' object is not subscriptable")
        }
    }

    // MARK: Operators

    private func unary(_ op: String, _ value: Value) throws(ChatTemplateError) -> Value {
        if case let .undefined(undefined) = value { throw error(undefined.message) }
        switch value {
        case let .int(number):
            guard op == "-" else { return .int(number) }
            let (negated, overflow) = (0).subtractingReportingOverflow(number)
            if overflow { throw error("integer overflow") }
            return .int(negated)
        case let .bool(flag): return .int(op == "-" ? (flag ? -1 : 0) : (flag ? 1 : 0))
        case let .double(number): return .double(op == "-" ? -number : number)
        default: throw error("bad operand type for unary \(op): '\(value.typeName)'")
        }
    }

    private func unsupported(_ op: String, _ left: Value, _ right: Value) -> ChatTemplateError {
        error("unsupported operand type(s) for \(op): '\(left.typeName)' and '\(right.typeName)'")
    }

    private func checkedInt(_ result: (partialValue: Int, overflow: Bool)) throws(ChatTemplateError) -> Value {
        if result.overflow { throw error("integer overflow") }
        return .int(result.partialValue)
    }

    private func repeated(_ values: [Value], _ times: Int) throws(ChatTemplateError) -> [Value] {
        guard times > 0 else { return [] }
        guard values.count <= Self.maximumBuiltSize / times else { throw error("sequence repetition too large") }
        return Array([[Value]](repeating: values, count: times).joined())
    }

    func binary(_ op: String, _ left: Value, _ right: Value) throws(ChatTemplateError) -> Value {
        if op == "~" { return .string(try concatenated(left.pythonString, right.pythonString)) }
        if case let .undefined(undefined) = left { throw error(undefined.message) }
        if case let .undefined(undefined) = right { throw error(undefined.message) }
        if let markup = try markupOperation(op, left, right) { return markup }
        switch (op, left, right) {
        case let ("+", .string(a), .string(b)): return .string(try concatenated(a, b))
        case let ("+", .list(a), .list(b)) where a.count + b.count <= Self.maximumBuiltSize: return .list(a + b)
        case let ("+", .tuple(a), .tuple(b)) where a.count + b.count <= Self.maximumBuiltSize: return .tuple(a + b)
        case ("+", .list, .list), ("+", .tuple, .tuple): throw error("concatenated sequence too large")
        // Python words the failure of a sequence's own `+` differently from other operand mismatches.
        case ("+", .string, _), ("+", .list, _), ("+", .tuple, _):
            throw error("can only concatenate \(left.typeName) (not \"\(right.typeName)\") to \(left.typeName)")
        case let ("*", .string(text), _) where right.integer != nil && !(right.number == nil):
            let times = right.integer!
            guard times > 0 else { return .string("") }
            guard text.utf8.count <= Self.maximumBuiltSize / times else { throw error("string repetition too large") }
            return .string(String(repeating: text, count: times))
        case let ("*", _, .string(text)) where left.integer != nil:
            return try binary("*", .string(text), left)
        case let ("*", .list(values), _) where right.integer != nil: return .list(try repeated(values, right.integer!))
        case let ("*", .tuple(values), _) where right.integer != nil: return .tuple(try repeated(values, right.integer!))
        case let ("*", _, .list(values)) where left.integer != nil: return .list(try repeated(values, left.integer!))
        case ("%", .string, _): throw error("printf-style string formatting with '%' is not supported")
        default: break
        }
        if let a = left.integer, let b = right.integer {
            switch op {
            case "+": return try checkedInt(a.addingReportingOverflow(b))
            case "-": return try checkedInt(a.subtractingReportingOverflow(b))
            case "*": return try checkedInt(a.multipliedReportingOverflow(by: b))
            case "/":
                guard b != 0 else { throw error("division by zero") }
                return .double(Double(a) / Double(b))
            case "//", "%":
                guard b != 0 else { throw error("integer division or modulo by zero") }
                var quotient = a / b
                var remainder = a % b
                if remainder != 0, (remainder < 0) != (b < 0) {
                    quotient -= 1
                    remainder += b
                }
                return .int(op == "//" ? quotient : remainder)
            case "**":
                if b < 0 { return .double(pow(Double(a), Double(b))) }
                var result = 1
                var base = a
                var exponent = b
                while exponent > 0 {
                    if exponent & 1 == 1 { result = try checkedIntValue(result.multipliedReportingOverflow(by: base)) }
                    exponent >>= 1
                    if exponent > 0 { base = try checkedIntValue(base.multipliedReportingOverflow(by: base)) }
                }
                return .int(result)
            default: break
            }
        }
        if let a = left.number, let b = right.number {
            switch op {
            case "+": return .double(a + b)
            case "-": return .double(a - b)
            case "*": return .double(a * b)
            case "/":
                guard b != 0 else { throw error("float division by zero") }
                return .double(a / b)
            case "//", "%":
                guard b != 0 else { throw error("float modulo") }
                var remainder = fmod(a, b)
                if remainder != 0, (remainder < 0) != (b < 0) { remainder += b }
                if op == "%" { return .double(remainder == 0 ? (b < 0 ? -0.0 : 0.0) : remainder) }
                return .double(((a - remainder) / b).rounded())
            case "**": return .double(pow(a, b))
            default: break
            }
        }
        throw unsupported(op, left, right)
    }

    func concatenated(_ a: String, _ b: String) throws(ChatTemplateError) -> String {
        guard a.utf8.count + b.utf8.count <= Self.maximumBuiltSize else { throw error("concatenated string too large") }
        return a + b
    }

    private func checkedIntValue(_ result: (partialValue: Int, overflow: Bool)) throws(ChatTemplateError) -> Int {
        if result.overflow { throw error("integer overflow") }
        return result.partialValue
    }

    /// Python's ordering for `<` and friends; nil where Python raises TypeError.
    func order(_ left: Value, _ right: Value) -> Int? {
        if let a = left.stringContent, let b = right.stringContent {
            if a.utf8.elementsEqual(b.utf8) { return 0 }
            // UTF-8 byte order is code point order.
            return a.utf8.lexicographicallyPrecedes(b.utf8) ? -1 : 1
        }
        switch (left, right) {
        case let (.list(a), .list(b)), let (.tuple(a), .tuple(b)):
            for (x, y) in zip(a, b) where !x.pythonEquals(y) { return order(x, y) }
            return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
        default:
            if let a = left.integer, let b = right.integer { return a == b ? 0 : (a < b ? -1 : 1) }
            if let a = left.number, let b = right.number { return a == b ? 0 : (a < b ? -1 : 1) }
            return nil
        }
    }

    mutating func contains(_ container: Value, _ element: Value) throws(ChatTemplateError) -> Bool {
        switch container {
        case let .string(text), let .markup(text):
            guard let needle = element.stringContent else {
                throw error("'in <string>' requires string as left operand, not \(element.typeName)")
            }
            return utf8Find(needle, in: text) != nil
        case let .list(values), let .tuple(values): return values.contains { $0.pythonEquals(element) }
        case let .dict(pairs): return pairs.contains { $0.0.pythonEquals(element) }
        case let .namespace(namespace): return namespace.attributes.contains { Value.string($0.0).pythonEquals(element) }
        case let .generator(generator):
            // Python's `in` consumes a generator only up to the first match.
            while let item = try generator.next(&self) {
                if item.pythonEquals(element) { return true }
            }
            return false
        case .undefined: return false
        default: throw error("argument of type '\(container.typeName)' is not iterable")
        }
    }

    mutating func compare(_ op: String, _ left: Value, _ right: Value) throws(ChatTemplateError) -> Bool {
        switch op {
        case "==": return left.pythonEquals(right)
        case "!=": return !left.pythonEquals(right)
        case "in": return try contains(right, left)
        case "not in": return !(try contains(right, left))
        default:
            if case let .undefined(undefined) = left { throw error(undefined.message) }
            if case let .undefined(undefined) = right { throw error(undefined.message) }
            guard let ordering = order(left, right) else {
                throw error("'\(op)' not supported between instances of '\(left.typeName)' and '\(right.typeName)'")
            }
            switch op {
            case "<": return ordering < 0
            case "<=": return ordering <= 0
            case ">": return ordering > 0
            default: return ordering >= 0
            }
        }
    }
}

/// The UTF-8 offset of `needle` in `haystack` (code point order is byte order in UTF-8, so this is Python's `find`).
func utf8Find(_ needle: String, in haystack: String, from start: Int = 0) -> Int? {
    let h = Array(haystack.utf8)
    let n = Array(needle.utf8)
    if n.isEmpty { return start <= h.count ? start : nil }
    guard h.count >= n.count, start <= h.count - n.count else { return nil }
    for index in start...(h.count - n.count) where h[index] == n[0] {
        if h[index..<index + n.count].elementsEqual(n) { return index }
    }
    return nil
}
