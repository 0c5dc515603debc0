import ArgumentParser

@main
struct VLM: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vlm",
        abstract: "Run vision-language models from Hugging Face checkpoints.",
        subcommands: [Classify.self, Embed.self, Tokenize.self, Bench.self]
    )
}

/// `--model`: where every command finds its checkpoint.
struct ModelOption: ParsableArguments {
    @Option(name: .long, help: "A checkpoint directory laid out like a Hugging Face model repository.")
    var model: String
}
