// swift-tools-version: 6.1
import PackageDescription

// No target carries unsafe compiler flags: SwiftPM refuses them in dependencies, and SwiftVLM must be usable as one.
let package = Package(
    name: "SwiftVLM",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "SwiftVLM", targets: ["SwiftVLM"]),
        .library(name: "SwiftVLMServer", targets: ["VLMServer"]),
        .executable(name: "vlm", targets: ["vlm"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        // The HTTP server of `vlm serve`; its default traits pull in swift-configuration, which nothing here needs.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        // C libraries from Debian's -dev packages.
        .systemLibrary(name: "CDNNL", path: "Sources/CDNNL"),
        .systemLibrary(name: "CTurboJPEG", path: "Sources/CTurboJPEG"),
        .systemLibrary(name: "CSPNG", path: "Sources/CSPNG"),
        .systemLibrary(name: "CWebP", path: "Sources/CWebP"),
        .systemLibrary(name: "CZlib", path: "Sources/CZlib"),
        .systemLibrary(name: "CTIFF", path: "Sources/CTIFF"),
        .systemLibrary(name: "CLCMS2", path: "Sources/CLCMS2"),

        // libjpeg's own API, for the one question libturbojpeg's cannot answer (see probe.c).
        .target(name: "CJPEGProbe", linkerSettings: [.linkedLibrary("jpeg", .when(platforms: [.linux]))]),
        // Hand-written AVX-512 kernels (attention, layer norm) with portable fallbacks, and the GEMM of builds
        // without oneDNN (Accelerate on Apple platforms).
        .target(name: "CVLMKernels", linkerSettings: [.linkedFramework("Accelerate", .when(platforms: [.macOS, .iOS]))]),
        // oneDNN 2.x is Linux-only here (Homebrew ships 3.x, another C API); elsewhere VLMTensor uses CVLMKernels.
        .target(name: "VLMTensor", dependencies: [
            .target(name: "CDNNL", condition: .when(platforms: [.linux])),
            "CVLMKernels",
        ]),
        .target(name: "VLMCheckpoint", dependencies: ["VLMTensor"]),
        // The Jinja chat-template interpreter and the strict JSON reader it shares with the tokenizers.
        .target(name: "VLMTemplates"),
        .target(name: "VLMTokenizers", dependencies: ["VLMTemplates"]),
        .target(name: "VLMGrammar", dependencies: ["VLMTemplates", "VLMModels"]),
        .target(name: "VLMImages", dependencies: ["VLMTensor", "CTurboJPEG", "CSPNG", "CWebP", "CZlib", "CTIFF", "CLCMS2", "CJPEGProbe"]),
        .target(name: "VLMModels", dependencies: ["VLMTensor", "VLMCheckpoint", "VLMImages"]),
        // Gradients, optimizers and the training recipes (LiT) over the models' parameters.
        .target(name: "VLMTraining", dependencies: ["VLMTensor", "VLMCheckpoint", "VLMTemplates", "VLMModels"]),
        .target(name: "VLMPipelines", dependencies: ["VLMTensor", "VLMCheckpoint", "VLMTemplates", "VLMTokenizers", "VLMImages", "VLMModels", "VLMTraining", "VLMGrammar"]),
        .target(name: "VLMHub"),
        .target(name: "SwiftVLM", dependencies: ["VLMTensor", "VLMCheckpoint", "VLMTemplates", "VLMTokenizers", "VLMImages", "VLMModels", "VLMPipelines", "VLMTraining", "VLMGrammar", "VLMHub"]),
        // The OpenAI-compatible HTTP server (`vlm serve`).
        .target(name: "VLMServer", dependencies: [
            "SwiftVLM",
            .product(name: "Hummingbird", package: "hummingbird"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        ]),
        .executableTarget(name: "vlm", dependencies: [
            "SwiftVLM",
            "VLMServer",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),

        // Runs untrusted-input readers on arbitrary bytes: under libFuzzer (scripts/fuzz), or replaying saved inputs.
        .executableTarget(name: "vlm-fuzz", dependencies: ["SwiftVLM", "VLMServer"], path: "Sources/VLMFuzz"),

        .testTarget(name: "VLMTensorTests", dependencies: ["VLMTensor"]),
        .testTarget(name: "VLMCheckpointTests", dependencies: ["VLMCheckpoint"]),
        .testTarget(name: "VLMTemplatesTests", dependencies: ["VLMTemplates"]),
        .testTarget(name: "VLMTokenizersTests", dependencies: ["VLMTokenizers"]),
        .testTarget(name: "VLMGrammarTests", dependencies: ["VLMGrammar", "VLMTemplates"]),
        .testTarget(name: "VLMImagesTests", dependencies: ["VLMImages"]),
        .testTarget(name: "VLMModelsTests", dependencies: ["VLMModels", "VLMCheckpoint", "VLMTensor", "VLMImages"]),
        .testTarget(name: "VLMPipelinesTests", dependencies: ["VLMPipelines", "VLMCheckpoint", "VLMTemplates", "VLMImages", "VLMTensor", "VLMGrammar"]),
        .testTarget(name: "VLMTrainingTests", dependencies: ["VLMTraining", "VLMModels", "VLMCheckpoint", "VLMImages", "VLMTensor"]),
        .testTarget(name: "VLMHubTests", dependencies: ["VLMHub", "VLMCheckpoint"]),
        .testTarget(name: "vlmTests", dependencies: ["vlm", "VLMCheckpoint"]),
        .testTarget(name: "VLMServerTests", dependencies: [
            "VLMServer", "SwiftVLM",
            .product(name: "Hummingbird", package: "hummingbird"),
        ]),
    ],
    swiftLanguageModes: [.v6]
)
