import Foundation

/// transformers 5's vectorized `_beam_search`, one batch item at a time, in the same float32 arithmetic: each step
/// takes the best `(eos count + 1) · numBeams` (at least `2 · numBeams`) continuations of all beams, keeps the best
/// `numBeams` unfinished ones running and merges the finished ones, length-penalized, into the hypotheses.
private struct BeamItem {
    var running: [[Int]]
    var runningScores: [Float]
    var hypotheses: [[Int]]
    var hypothesisScores: [Float]
    var hypothesisFinished: [Bool]
    var improvementPossible = true

    init(beams: Int) {
        running = Array(repeating: [], count: beams)
        // Every beam starts as the same prompt: only the first may contribute continuations at the first step.
        runningScores = [0] + Array(repeating: -1e9, count: beams - 1)
        hypotheses = Array(repeating: [], count: beams)
        hypothesisScores = Array(repeating: -1e9, count: beams)
        hypothesisFinished = Array(repeating: false, count: beams)
    }
}

extension CausalLanguageModel {
    func beamSearch(prompt: GenerationPrompt, batch: Int, newTokens: Int, config: GenerationConfig,
                    criteria: [any StoppingCriterion]) throws -> GenerationOutput {
        let beams = config.numBeams, vocabulary = vocabularySize
        let keep = max(2, 1 + config.eosTokenIds.count) * beams
        let eos = Set(config.eosTokenIds)
        let processors = config.logitsProcessors
        let lengthPenalty = config.lengthPenalty
        var state = try DecodingState(model: self, prompt: prompt, rows: batch * beams, capacity: prompt.length + newTokens)
        let promptHistories = prompt.histories
        var items = Array(repeating: BeamItem(beams: beams), count: batch)

        for generatedCount in 0..<newTokens {
            var allCandidatesStop = true
            var sources = [Int]()
            for b in 0..<batch {
                var item = items[b]
                var accumulated = [Float]()
                accumulated.reserveCapacity(beams * vocabulary)
                for beam in 0..<beams {
                    let row = b * beams + beam
                    var history = promptHistories[row]
                    history.tokens += item.running[beam]
                    var scores = logSoftmax(state.scores(row: row))
                    for processor in processors { processor.process(&scores, history: history) }
                    accumulated += scores.map { $0 + item.runningScores[beam] }
                }
                let candidates = largestIndices(accumulated, count: keep)
                let candidateScores = candidates.map { accumulated[$0] }
                let candidateBeams = candidates.map { $0 / vocabulary }
                let candidateSequences = candidates.map { item.running[$0 / vocabulary] + [$0 % vocabulary] }
                let stops = candidateSequences.enumerated().map { index, sequence in
                    if generatedCount + 1 >= newTokens || eos.contains(sequence.last!) { return true }
                    var history = promptHistories[b * beams + candidateBeams[index]]
                    history.tokens += sequence
                    return criteria.contains { $0.shouldStop(history) }
                }
                allCandidatesStop = allCandidatesStop && !stops.contains(false)

                // The best unfinished continuations run on.
                let runningScores = zip(candidateScores, stops).map { $0 + ($1 ? -1e9 : 0) }
                let next = largestIndices(runningScores, count: beams)
                item.running = next.map { candidateSequences[$0] }
                item.runningScores = next.map { runningScores[$0] }
                sources += next.map { b * beams + candidateBeams[$0] }

                // Finished continuations among the best `beams` join the hypotheses if they beat them.
                let divisor = Float(pow(Double(generatedCount + 1), lengthPenalty))
                let full = config.earlyStopping == .always && !item.hypothesisFinished.contains(false)
                var finishedScores = [Float]()
                var justFinished = [Bool]()
                for index in candidates.indices {
                    let finished = stops[index] && index < beams
                    var score = candidateScores[index] / divisor
                    score += full ? -1e9 : 0
                    score += item.improvementPossible ? 0 : -1e9
                    score += finished ? 0 : -1e9
                    finishedScores.append(score)
                    justFinished.append(finished)
                }
                let mergedSequences = item.hypotheses + candidateSequences
                let mergedScores = item.hypothesisScores + finishedScores
                let mergedFinished = item.hypothesisFinished + justFinished
                let best = largestIndices(mergedScores, count: beams)
                item.hypotheses = best.map { mergedSequences[$0] }
                item.hypothesisScores = best.map { mergedScores[$0] }
                item.hypothesisFinished = best.map { mergedFinished[$0] }

                // Could a running beam still beat the worst hypothesis?
                let length = config.earlyStopping == .never && lengthPenalty > 0 ? newTokens : generatedCount + 1
                let bestPossible = item.runningScores[0] / Float(pow(Double(length), lengthPenalty))
                let worst = item.hypothesisScores.min()!
                item.improvementPossible = item.improvementPossible
                    && item.hypothesisFinished.contains { bestPossible > ($0 ? worst : -1e9) }
                items[b] = item
            }
            let improvementPossible = items.contains { $0.improvementPossible }
            let openBeam = !(config.earlyStopping == .always && items.allSatisfy { !$0.hypothesisFinished.contains(false) })
            if !(improvementPossible && openBeam && !allCandidatesStop) { break }
            try state.cache.reorder(rows: sources)
            try state.advance(tokens: items.flatMap { $0.running.map { $0.last! } })
        }
        let returned = config.numReturnSequences
        return GenerationOutput(sequences: items.flatMap { $0.hypotheses.prefix(returned) },
                                scores: items.flatMap { $0.hypothesisScores.prefix(returned) })
    }
}
