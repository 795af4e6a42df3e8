// The SDK over WebSocket against a real gateway (`imgw serve --ws-listen`).
import { chatSuite } from "./support/suite.mjs";

chatSuite("ws");
