import Foundation

/// The response templates `transformers serve` falls back on for model types whose tokenizers ship none
/// (`_RESPONSE_TEMPLATE_FALLBACKS` of transformers 5.23's cli/serving/utils.py): Qwen 2 and 3 (`<think>`, JSON in
/// `<tool_call>`), Qwen 3.5 (XML-like parameters in `<tool_call><function=…>`) and Gemma 4.
extension ResponseTemplate {
    private static let servingFallbacks: [([String], String)] = [
        (["qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe"],
         #"{"defaults": {"role": "assistant"}, "start_anchor": "<|im_start|>assistant\n", "fields": {"reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"}, "tool_calls": {"open_pattern": "\\s*<tool_call>", "close": "</tool_call>", "repeats": true, "content": "json", "transform": {"type": "function", "function": "{content}"}}, "content": {"close_pattern": "\\s*(?:<\\|im_end\\|>|<\\|endoftext\\|>|<\\|eot_id\\|>)", "content": "text"}}}"#),
        (["qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"],
         #"{"defaults": {"role": "assistant"}, "start_anchor": "<|im_start|>assistant\n", "fields": {"reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"}, "tool_calls": {"open_pattern": "\\s*<tool_call>\\s*<function=(?P<name>[^>\\n]+)>", "close_pattern": "</function>\\s*</tool_call>", "repeats": true, "content": "xml-inline", "content_args": {"tag_pattern": "<parameter=(?P<key>[^>\\n]+)>\\s*(?P<value>.*?)\\s*</parameter>"}, "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}}, "content": {"close_pattern": "\\s*(?:<\\|im_end\\|>|<\\|endoftext\\|>)", "content": "text"}}}"#),
        (["gemma4"],
         #"{"defaults": {"role": "assistant"}, "start_anchor": ["<|turn>model\n", "<tool_response|>"], "fields": {"reasoning_content": {"open": "<|channel>thought\n", "close": "<channel|>", "content": "text"}, "tool_calls": {"open_pattern": "<\\|tool_call>call:(?P<name>\\w+)", "close": "<tool_call|>", "repeats": true, "content": "json", "content_args": {"unquoted_keys": true, "string_delims": [["<|\"|>", "<|\"|>"]]}, "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}}, "content": {"close": ["<turn|>", "<|tool_response>", "<eos>"], "content": "text"}}}"#),
    ]

    /// transformers serve's template for a model type, nil when it has none.
    public static func servingFallback(modelType: String) -> ResponseTemplate? {
        guard let (_, text) = servingFallbacks.first(where: { $0.0.contains(modelType) }) else { return nil }
        // The texts above are transformers' own templates, loaded by the tests: they parse and load.
        return try! ResponseTemplate(JSONValue(parsing: Data(text.utf8), file: "transformers serve's response template"))
    }
}
