import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

extension ImageTextToTextPipeline {
    /// LLaVA-1.5, LLaVA-NeXT (an mmproj with `clip.vision.image_grid_pinpoints`) or Gemma 3 (`clip.projector_type`
    /// "gemma3") from llama.cpp's GGUF pair, as `llama-mtmd-cli -m LM.gguf --mmproj MMPROJ.gguf` takes it: the tokenizer
    /// and chat template from the language model's metadata, the generation settings its special token ids with the
    /// text-generation pipeline's defaults (as a GGUF language model alone gets them).
    ///
    /// LLaVA: the model as ``LlavaForConditionalGeneration/init(gguf:mmproj:)`` or
    /// ``LlavaNextForConditionalGeneration/init(gguf:mmproj:)`` reads it. Messages reach the template with text
    /// contents, each image part as `<image>`, as llama.cpp gives them to such templates. Images are prepared as
    /// transformers' `CLIPImageProcessor` does for LLaVA-1.5 checkpoints (bicubic resize of the shortest edge to the
    /// mmproj's image size, centre crop, its mean and std), and for LLaVA-NeXT as `LlavaNextImageProcessorPil` with the
    /// mmproj's pinpoints: the fidelity target; llama.cpp pads LLaVA-1.5's images to a square with the mean colour
    /// instead, so its image features differ on non-square images.
    ///
    /// Gemma 3: the model as ``Gemma3ForConditionalGeneration/init(gguf:mmproj:)`` reads it, with `Gemma3Processor`
    /// (each `<start_of_image>` expanded with transformers' blank lines, which llama.cpp's mtmd leaves out) over the
    /// mmproj's image size, mean and std (bilinear, as `Gemma3ImageProcessorPil`); messages reach the template as
    /// transformers gives them, image parts and all. Generation also ends at `<end_of_turn>`, as Gemma 3's
    /// generation_config.json and llama.cpp have it.
    ///
    /// - Throws: the loaders' errors, each naming the file; `PipelineError.noChatTemplate` when the language model's
    ///   metadata has no chat template.
    public convenience init(gguf languageModel: URL, mmproj: URL) throws {
        defer { releaseParallelWorkers() }  // as ModelRegistry.loaded
        let lmFile = try GGUFFile(url: languageModel), projectionFile = try GGUFFile(url: mmproj)
        if Gemma3MMProjConfig.describes(projectionFile) {
            try self.init(gemma3: lmFile, mmproj: projectionFile)
            return
        }
        let projection = try LlavaMMProjConfig(projectionFile)
        // The model first: a mismatched pair is refused before the tokenizer is read.
        let model: any ImageChatModel = try projection.imageGridPinpoints == nil
            ? LlavaForConditionalGeneration(gguf: lmFile, mmproj: projectionFile)
            : LlavaNextForConditionalGeneration(gguf: lmFile, mmproj: projectionFile)
        let (tokenizer, chatTemplate) = try loadTokenizer(gguf: lmFile)
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        let side = projection.visionConfig.imageSize
        let processor: any ImageChatProcessor
        if let pinpoints = projection.imageGridPinpoints {
            // LlavaNextImageProcessorPil's settings as llava-hf's processors have them, from the mmproj's values.
            let settings: [String: Any] = [
                "size": ["shortest_edge": side], "crop_size": ["height": side, "width": side],
                "image_mean": projection.imageMean, "image_std": projection.imageStd,
                "image_grid_pinpoints": pinpoints.map { [$0.height, $0.width] },
            ]
            let tiling = try LlavaNextImageProcessor(config: LlavaNextImageProcessorConfig(
                json: JSONSerialization.data(withJSONObject: settings), file: mmproj.path))
            processor = LlavaNextProcessor(imageProcessor: tiling, tokenizer: tokenizer, imageToken: "<image>",
                                           imageTokenId: model.imageTokenId, patchSize: projection.visionConfig.patchSize)
        } else {
            var images = StandardImageProcessorConfig.clip
            images.size = .shortestEdge(side)
            (images.cropHeight, images.cropWidth) = (side, side)
            (images.imageMean, images.imageStd) = (projection.imageMean, projection.imageStd)
            let patches = projection.visionConfig.imageSize / projection.visionConfig.patchSize
            processor = LlavaProcessor(imageProcessor: StandardImageProcessor(config: images), tokenizer: tokenizer,
                                       imageToken: "<image>", imageTokenId: model.imageTokenId,
                                       imageTokensPerImage: patches * patches)
        }
        let decoder = try LlamaConfig(gguf: lmFile)
        var config = GenerationConfig()
        config.eosTokenIds = lmFile.endOfGenerationIds(eos: decoder.eosTokenIds)
        config.bosTokenId = decoder.bosTokenId
        self.init(model: model, processor: processor, chatTemplate: chatTemplate,
                  config: TextGenerationPipeline.withPipelineDefaults(config, setKeys: []), imagePartsAsText: true)
    }

    private convenience init(gemma3 lmFile: GGUFFile, mmproj: GGUFFile) throws {
        let projection = try Gemma3MMProjConfig(mmproj)
        let model = try Gemma3ForConditionalGeneration(gguf: lmFile, mmproj: mmproj)
        let (tokenizer, chatTemplate) = try loadTokenizer(gguf: lmFile)
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        var images = StandardImageProcessorConfig.vit
        let side = projection.visionConfig.imageSize
        images.size = .exact(height: side, width: side)
        (images.imageMean, images.imageStd) = (projection.imageMean, projection.imageStd)
        let processor = Gemma3Processor(imageProcessor: StandardImageProcessor(config: images), tokenizer: tokenizer,
                                        imageSeqLength: model.config.mmTokensPerImage)
        var config = GenerationConfig()
        config.eosTokenIds = lmFile.endOfGenerationIds(eos: model.config.textConfig.eosTokenIds)
        config.bosTokenId = model.config.textConfig.bosTokenId
        self.init(model: model, processor: processor, chatTemplate: chatTemplate,
                  config: TextGenerationPipeline.withPipelineDefaults(config, setKeys: []))
    }
}
