/// A Python generator, as jinja2's `map`, `select`, `reject`, `selectattr`, `rejectattr`, `items`, `unique` and
/// `batch` filters return: lazy and one-pass. Templates can observe both: the filter's own errors surface only when
/// something iterates it, whatever consumes items takes them away from every other holder of the same generator, and
/// it has no length, is not a sequence and is not JSON serializable.
final class TemplateGenerator {
    /// The Python function whose generator this is, as `repr` names it ("select_or_reject").
    let functionName: String
    /// Produces the next item, nil at the end; nil itself once the generator has finished or raised.
    private var produce: ((inout Interpreter) throws(ChatTemplateError) -> Value?)?

    init(functionName: String, produce: @escaping (inout Interpreter) throws(ChatTemplateError) -> Value?) {
        self.functionName = functionName
        self.produce = produce
    }

    /// The next item, or nil once the generator is exhausted. A generator that raised is finished, as in Python.
    func next(_ interpreter: inout Interpreter) throws(ChatTemplateError) -> Value? {
        guard let produce else { return nil }
        do {
            if let item = try produce(&interpreter) { return item }
        } catch {
            self.produce = nil
            throw error
        }
        self.produce = nil
        return nil
    }

    /// Python's default `repr` of a generator; the address is this object's, so it differs between runs as Python's does.
    var pythonRepr: String {
        "<generator object \(functionName) at 0x\(String(UInt(bitPattern: ObjectIdentifier(self).hashValue), radix: 16))>"
    }
}

extension Interpreter {
    /// A generator whose body runs only when first pulled, as a Python generator function's does: `body` returns the
    /// items' source (or nil to yield nothing), and `transform` maps each source item to the item to yield, or to nil
    /// to skip it.
    func makeGenerator(
        _ functionName: String,
        body: @escaping (inout Interpreter) throws(ChatTemplateError) -> Value?,
        transform: @escaping (inout Interpreter, Value) throws(ChatTemplateError) -> Value?
    ) -> Value {
        var source: ValueCursor?
        return .generator(TemplateGenerator(functionName: functionName) { (interpreter: inout Interpreter) throws(ChatTemplateError) in
            if source == nil {
                guard let items = try body(&interpreter) else { return nil }
                source = try interpreter.cursor(over: items)
            }
            while let item = try source!.next(&interpreter) {
                try interpreter.countIteration()
                if let result = try transform(&interpreter, item) { return result }
            }
            return nil
        })
    }

    /// Pulls items one at a time: from a generator without draining it, from anything else as `iterate` lists them.
    mutating func cursor(over value: Value) throws(ChatTemplateError) -> ValueCursor {
        if case let .generator(generator) = value { return ValueCursor(generator: generator, items: []) }
        return ValueCursor(generator: nil, items: try iterate(value))
    }
}

/// A position in an iterable: Python's `iter(x)`.
struct ValueCursor {
    let generator: TemplateGenerator?
    let items: [Value]
    private var index = 0

    init(generator: TemplateGenerator?, items: [Value]) {
        self.generator = generator
        self.items = items
    }

    mutating func next(_ interpreter: inout Interpreter) throws(ChatTemplateError) -> Value? {
        if let generator { return try generator.next(&interpreter) }
        guard index < items.count else { return nil }
        index += 1
        return items[index - 1]
    }
}
