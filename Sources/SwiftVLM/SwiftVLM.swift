// One import for library users: `import SwiftVLM` brings every module's public API.
@_exported import VLMTensor
@_exported import VLMCheckpoint
@_exported import VLMTemplates
@_exported import VLMTokenizers
@_exported import VLMImages
@_exported import VLMModels
@_exported import VLMPipelines
@_exported import VLMTraining
@_exported import VLMGrammar
@_exported import VLMHub
