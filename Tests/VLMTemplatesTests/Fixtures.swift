import Foundation

/// Tests/Fixtures/chat-templates, found from this file's path so tests run from any working directory.
let chatTemplateFixtures: URL = {
    var url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    while !FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) {
        url.deleteLastPathComponent()
    }
    return url.appendingPathComponent("Tests/Fixtures/chat-templates")
}()
