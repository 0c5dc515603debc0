import Foundation
import VLMCheckpoint
import VLMModels
import VLMTemplates

extension TextGenerationPipeline {
    /// Loads a language model with its tokenizer, chat template and generation settings, as transformers'
    /// `pipeline("text-generation", model=path)` does: from a checkpoint directory (config.json's `model_type`, the
    /// tokenizer files, generation_config.json) or from a llama.cpp GGUF file (the metadata gives the config, the
    /// tokenizer and the template; the generation settings are the config's special token ids, as
    /// `GenerationConfig.from_model_config` makes them).
    ///
    /// Settings the model leaves unset take the pipeline's defaults (`_default_generation_config`): at most 256 new
    /// tokens, and sampling at temperature 0.7.
    ///
    /// - Throws: the loaders' errors, each naming the file and what is wrong.
    public convenience init(path: URL) throws {
        var isDirectory: ObjCBool = false
        let exists = FileManager.default.fileExists(atPath: path.path, isDirectory: &isDirectory)
        if !exists || isDirectory.boolValue {
            // ModelDirectory names a missing path; a checkpoint of another family is refused before its tokenizer is read.
            let checkpoint = try ModelDirectory(url: path)
            _ = try ModelRegistry.family(of: checkpoint, for: .generate)
            let (tokenizer, chatTemplate) = try loadTokenizer(path: path)
            let model = try ModelRegistry.causalLanguageModel(checkpoint)
            let config = try GenerationConfig.load(directory: path)
            self.init(model: model, tokenizer: tokenizer,
                      config: Self.withPipelineDefaults(config, setKeys: generationKeys(directory: path)), chatTemplate: chatTemplate,
                      responseTemplate: try ResponseTemplate.load(directory: path))
        } else {
            // One parse of the file serves the tokenizer and the model.
            let file = try GGUFFile(url: path)
            let (tokenizer, chatTemplate) = try loadTokenizer(gguf: file)
            let (model, bosTokenId, eosTokenIds) = try ModelRegistry.causalLanguageModel(gguf: file)
            var config = GenerationConfig()
            config.eosTokenIds = eosTokenIds
            config.bosTokenId = bosTokenId
            self.init(model: model, tokenizer: tokenizer, config: Self.withPipelineDefaults(config, setKeys: []),
                      chatTemplate: chatTemplate)
        }
    }

    /// transformers' `Pipeline._get_generate_kwargs`: the pipeline's defaults for what the model does not set, the
    /// sampling ones only when sampling.
    static func withPipelineDefaults(_ config: GenerationConfig, setKeys: Set<String>) -> GenerationConfig {
        var config = config
        if !setKeys.contains("max_new_tokens") && !setKeys.contains("max_length") { config.maxNewTokens = 256 }
        if !setKeys.contains("do_sample") { config.doSample = true }
        if config.doSample && !setKeys.contains("temperature") { config.temperature = 0.7 }
        return config
    }
}

/// The keys of the file `GenerationConfig.load(directory:)` reads: which settings the checkpoint sets itself, and so
/// which ones a pipeline's defaults may fill in.
func generationKeys(directory: URL) -> Set<String> {
    for name in ["generation_config.json", "config.json"] {
        guard let data = try? Data(contentsOf: directory.appendingPathComponent(name)) else { continue }
        return Set(((try? JSONSerialization.jsonObject(with: data)) as? [String: Any])?.keys.map { $0 } ?? [])
    }
    return []
}
