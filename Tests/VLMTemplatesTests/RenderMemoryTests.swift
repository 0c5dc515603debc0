import Testing
@testable import VLMTemplates

/// A macro is stored in the scope it captures, and a namespace can hold itself: cycles that reference counting never
/// frees. Found by the fuzzer's leak check on real templates (Kimi's, whose macros leaked on every render).
@Test func aRenderFreesTheCyclesItMade() throws {
    let template = try ChatTemplate(source: """
        {%- macro wrap() %}[{{ caller() }}]{% endmacro -%}
        {%- call wrap() %}x{% endcall -%}
        {%- set ns = namespace(items=[]) %}{% set ns.me = ns -%}
        {%- for item in [[1], [2]] if item recursive %}{{ loop(item[1:]) }}{{ item }}{% endfor -%}
        """)
    weak var renderScope: Scope?
    func render() throws -> String {
        let globals = Scope(parent: nil)
        globals.variables = Interpreter.globals(file: "chat_template", now: nil)
        let scope = Scope(parent: globals)
        renderScope = scope
        return try template.run(in: scope).text
    }
    #expect(try render() == "[x][1][2]")
    #expect(renderScope == nil)
}
