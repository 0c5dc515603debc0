import Foundation
import VLMCheckpoint
import VLMTemplates
import VLMTensor

/// Writes a trained checkpoint to `output` (created if needed) as transformers' `save_pretrained` would after training
/// in fp32: every tensor of the original checkpoint in fp32, the trained ones (`replacing`, by name) in place of
/// theirs, in one model.safetensors; config.json as transformers writes it with `dtype` float32 (every other member
/// kept: a float stays a float, which its strict config classes insist on); and the tokenizer, processor, chat template
/// and generation files copied, so that transformers and every `vlm` command load it.
func writeCheckpoint(from directory: ModelDirectory, store: WeightStore, replacing trained: [String: Tensor], to output: URL) throws {
    do {
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
    } catch {
        throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
    }
    // The original's tensors read one at a time as they are written: a checkpoint's worth of fp32 never in memory.
    var shapes: [String: [Int]] = [:]
    for name in store.names {
        guard let shape = trained[name]?.shape ?? store.info(name)?.shape else {
            throw CheckpointError.missingTensor(file: directory.url.path, tensor: name)
        }
        shapes[name] = shape
    }
    try SafetensorsFile.write(shapes: shapes, to: output.appendingPathComponent(WeightStore.singleFileName)) { name in
        try trained[name] ?? store.tensor(name)
    }
    let configURL = directory.url.appendingPathComponent("config.json")
    guard case let .object(members) = try JSONValue(parsing: Data(contentsOf: configURL), file: configURL.path) else {
        throw CheckpointError.invalidJSON(file: configURL.path, reason: "not an object")
    }
    let config = JSONValue.object(members.filter { $0.0 != "dtype" && $0.0 != "torch_dtype" } + [("dtype", "float32")])
    let configData = Data((config.pythonJSONText(indent: 2, sortKeys: true) + "\n").utf8)
    do {
        try configData.write(to: output.appendingPathComponent("config.json"), options: .atomic)
        try copy(tokenizerFiles + ["preprocessor_config.json", "processor_config.json", "generation_config.json"], from: directory, to: output)
    } catch {
        throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
    }
}

/// A checkpoint's tokenizer and chat template files, which a trained model or adapter is saved with.
private let tokenizerFiles = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "spiece.model",
                              "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json"]

/// Copies those of `names` that `directory` has into `output`: the files' bytes, not links (a checkpoint's files may
/// be links: the Hugging Face cache's, relative ones).
private func copy(_ names: [String], from directory: ModelDirectory, to output: URL) throws {
    for name in names {
        guard let source = directory.fileURL(name) else { continue }
        let destination = output.appendingPathComponent(name)
        if source.standardizedFileURL == destination.standardizedFileURL { continue }
        try Data(contentsOf: source.resolvingSymlinksInPath()).write(to: destination, options: .atomic)
    }
}

/// Writes a LoRA adapter to `output` as PEFT's `save_pretrained` writes one, which `PeftModel.from_pretrained(base,
/// output)` loads: adapter_model.safetensors holding `tensors` (`A` and `B`, and the modules saved whole, under
/// PEFT's names) and adapter_config.json with `settings`, `targetModules` (a list of names, or a regular expression
/// over module paths), `modulesToSave` and `taskType`; the tokenizer and chat template files beside them, as Trainer
/// saves its processing class.
func writeLoraAdapter(_ tensors: [String: Tensor], settings: LoraSettings, targetModules: JSONValue, modulesToSave: [String]?,
                      taskType: String?, base: ModelDirectory, to output: URL) throws {
    do {
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
    } catch {
        throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
    }
    try SafetensorsFile.write(tensors, to: output.appendingPathComponent("adapter_model.safetensors"))
    let alpha: JSONValue = settings.alpha.rounded() == settings.alpha ? .int(Int(settings.alpha)) : .double(Double(settings.alpha))
    let config: JSONValue = .object([
        ("base_model_name_or_path", .string(base.url.path)), ("bias", "none"), ("fan_in_fan_out", false),
        ("inference_mode", true), ("init_lora_weights", true), ("lora_alpha", alpha), ("lora_dropout", .double(0)),
        ("modules_to_save", modulesToSave.map { .array($0.map(JSONValue.string)) } ?? .null), ("peft_type", "LORA"),
        ("r", .int(settings.rank)), ("target_modules", targetModules), ("task_type", taskType.map(JSONValue.string) ?? .null),
        ("use_dora", false), ("use_rslora", false),
    ])
    do {
        try Data((config.pythonJSONText(indent: 2, sortKeys: true) + "\n").utf8).write(to: output.appendingPathComponent("adapter_config.json"), options: .atomic)
        try copy(tokenizerFiles + ["preprocessor_config.json", "processor_config.json"], from: base, to: output)
    } catch {
        throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
    }
}
