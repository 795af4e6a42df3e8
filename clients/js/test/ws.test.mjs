// The SDK over WebSocket against a real gateway (`imgw serve --ws-listen`).
import { gatewayHasWebSocket } from "./support/gateway.mjs";
import { chatSuite } from "./support/suite.mjs";

if (gatewayHasWebSocket()) {
  chatSuite("ws");
} else {
  const { it } = await import("node:test");
  it("imgw-client over ws", { skip: "this imgw serve has no --ws-listen yet" }, () => {});
}
