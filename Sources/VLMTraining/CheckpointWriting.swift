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
    let copied = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "spiece.model",
                  "special_tokens_map.json", "added_tokens.json", "preprocessor_config.json", "processor_config.json",
                  "chat_template.jinja", "chat_template.json", "generation_config.json"]
    do {
        try configData.write(to: output.appendingPathComponent("config.json"), options: .atomic)
        for name in copied {
            guard let source = directory.fileURL(name) else { continue }
            let destination = output.appendingPathComponent(name)
            if source.standardizedFileURL == destination.standardizedFileURL { continue }
            // The file's bytes, not a link: a checkpoint's files may be links (the Hugging Face cache's, relative ones).
            try Data(contentsOf: source.resolvingSymlinksInPath()).write(to: destination, options: .atomic)
        }
    } catch {
        throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
    }
}
