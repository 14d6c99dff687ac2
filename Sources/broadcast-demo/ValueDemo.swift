import AsyncBroadcast

/// A temperature followed by two subscribers: a display that reads every
/// change, and a chart that is busy while the temperature changes five
/// times and then gets only the latest value.
func valueDemo() async {
    let temperature = BroadcastValue(20)

    // Both subscribe now: each starts from the current value, 20.
    let displaySubscription = temperature.subscribe()
    let chartSubscription = temperature.subscribe()
    print("subscribers: \(temperature.subscriberCount)")

    // Synchronization for the demo, so that its output is always the same:
    // what the display last showed, and two one-time signals for the chart.
    let displayed = BroadcastValue<Int?, Never>(nil)
    let chartReadFirst = BroadcastPromise<Void, Never>()
    let chartMayContinue = BroadcastPromise<Void, Never>()

    let display = Task { () -> [Int] in
        var shown: [Int] = []
        for await value in displaySubscription {
            shown.append(value)
            displayed.send(value)
        }
        return shown
    }
    let chart = Task { () -> [Int] in
        var drawn: [Int] = []
        var iterator = chartSubscription.makeAsyncIterator()
        if let first = await iterator.next() { drawn.append(first) }
        chartReadFirst.succeed()
        try? await chartMayContinue.value  // busy elsewhere until told
        while let value = await iterator.next() { drawn.append(value) }
        return drawn
    }

    try? await chartReadFirst.value
    await waitUntil(displayed, shows: 20)
    for value in 21...25 {
        temperature.send(value)
        await waitUntil(displayed, shows: value)
    }
    temperature.send(25)  // equal to the current value: not a change
    let before = temperature.update { value in  // atomic read-modify-write
        let old = value
        value += 1
        return old
    }
    await waitUntil(displayed, shows: 26)
    print("update: \(before) -> \(temperature.value) (value, read without waiting)")

    chartMayContinue.succeed()
    temperature.finish()  // each subscriber gets what it has not seen, then the end

    let shown = await display.value
    let drawn = await chart.value
    print("display (reads every change): \(shown.map(String.init).joined(separator: " "))")
    print("    send(25) while the value was 25 reached nobody: it is not a change")
    print("chart   (busy during 21...25): \(drawn.map(String.init).joined(separator: " "))")
    print("    21...25 were conflated: it got the latest value, not a backlog")

    var late: [Int] = []
    for await value in temperature { late.append(value) }
    print("a subscriber after finish: \(late.map(String.init).joined(separator: " ")), then the end")
    print("subscribers left after finish: \(temperature.subscriberCount)")
}

/// Waits until `value` holds `expected`.
func waitUntil(_ value: BroadcastValue<Int?, Never>, shows expected: Int) async {
    for await current in value where current == expected { return }
}
