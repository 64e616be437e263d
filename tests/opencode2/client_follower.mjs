// Follow a 2.x server's `/api/event` with its own client, `@opencode/client` 2.1.2, as an app built
// on it does: subscribe, read the session's messages each time the stream (re)connects (the stream
// keeps nothing across a disconnect, so what happened meanwhile is read back), and subscribe again
// after the stream fails. Prints JSON lines: {"connected": n} when a stream answers,
// {"messages": [...], "connection": n} for the read after it, {"event": ...} for each of the
// session's events, {"error": "..."} each time a stream or a read fails, and
// {"ended": "interrupted"} once the session's execution is said to be interrupted, or
// {"ended": "read"} after the first read with `once`.
//
// usage: node client_follower.mjs <baseUrl> <sessionID> follow|once   (password in OPENCODE_PASSWORD)
//
// The client uses `Promise.withResolvers` (Node 22); the Node here may be 20, which lacks it: the
// standard's few lines are added when it is missing, before the client is loaded.
Promise.withResolvers ??= function () {
  let resolve, reject
  const promise = new this((yes, no) => ((resolve = yes), (reject = no)))
  return { promise, resolve, reject }
}
const { OpenCode } = await import("@opencode/client")

const [baseUrl, sessionID, mode] = process.argv.slice(2)
const authorization = "Basic " + Buffer.from(`opencode:${process.env.OPENCODE_PASSWORD}`).toString("base64")
const client = OpenCode.make({ baseUrl, headers: { authorization } })
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n")
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

let connected = 0
const read = async () => say({ messages: (await client.message.list({ sessionID })).data, connection: connected })

const follow = async () => {
  for await (const event of client.event.subscribe()) {
    if (event.type === "server.connected") {
      say({ connected: ++connected })
      await read()
      if (mode === "once") return "read"
    }
    if (event.data?.sessionID !== sessionID) continue
    say({ event })
    if (event.type === "session.execution.interrupted") return "interrupted"
  }
}

for (;;) {
  try {
    const ended = await follow()
    if (ended) {
      say({ ended })
      process.exit(0)
    }
  } catch (error) {
    say({ error: String(error) })
  }
  await pause(250)
}
