// The SDK over TCP against a real gateway.
import { chatSuite } from "./support/suite.mjs";

chatSuite("tcp");
