// Preloaded (node --import) into a server the tests start that binds every interface by itself
// (@modelcontextprotocol/server-everything listens on PORT with no host): a listen on a bare port
// binds 127.0.0.1 instead, so nothing a test starts is reachable from outside the box.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, ...rest) {
  if (typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port))) {
    const host = typeof rest[0] === "string" ? [] : ["127.0.0.1"];
    return listen.call(this, port, ...host, ...rest);
  }
  return listen.call(this, port, ...rest);
};
