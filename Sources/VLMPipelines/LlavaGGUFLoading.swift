import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels

extension ImageTextToTextPipeline {
    /// LLaVA-1.5 from llama.cpp's GGUF pair, as `llama-mtmd-cli -m LM.gguf --mmproj MMPROJ.gguf` takes it: the
    /// model as ``LlavaForConditionalGeneration/init(gguf:mmproj:)`` reads it, the tokenizer and chat template from
    /// the language model's metadata, the generation settings its special token ids with the text-generation
    /// pipeline's defaults (as a GGUF language model alone gets them). Messages reach the template with text contents,
    /// each image part as `<image>`, as llama.cpp gives them to such templates.
    ///
    /// Images are prepared as transformers' `CLIPImageProcessor` does for LLaVA-1.5 checkpoints (bicubic resize of the
    /// shortest edge to the mmproj's image size, centre crop, its mean and std), the fidelity target; llama.cpp pads
    /// them to a square with the mean colour instead, so its image features differ on non-square images.
    ///
    /// - Throws: the loaders' errors, each naming the file; `PipelineError.noChatTemplate` when the language model's
    ///   metadata has no chat template.
    public convenience init(gguf languageModel: URL, mmproj: URL) throws {
        let lmFile = try GGUFFile(url: languageModel), projectionFile = try GGUFFile(url: mmproj)
        let model = try LlavaForConditionalGeneration(gguf: lmFile, mmproj: projectionFile)
        let projection = try LlavaMMProjConfig(projectionFile)
        let (tokenizer, chatTemplate) = try loadTokenizer(gguf: lmFile)
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        var images = StandardImageProcessorConfig.clip
        let side = projection.visionConfig.imageSize
        images.size = .shortestEdge(side)
        (images.cropHeight, images.cropWidth) = (side, side)
        (images.imageMean, images.imageStd) = (projection.imageMean, projection.imageStd)
        let patches = projection.visionConfig.imageSize / projection.visionConfig.patchSize
        let processor = LlavaProcessor(imageProcessor: StandardImageProcessor(config: images), tokenizer: tokenizer,
                                       imageToken: "<image>", imageTokenId: model.config.imageTokenIndex,
                                       imageTokensPerImage: patches * patches)
        var config = GenerationConfig()
        config.eosTokenIds = model.languageModel.config.eosTokenIds
        config.bosTokenId = model.languageModel.config.bosTokenId
        self.init(model: model, processor: processor, chatTemplate: chatTemplate,
                  config: TextGenerationPipeline.withPipelineDefaults(config, setKeys: []), imagePartsAsText: true)
    }
}
