#include "coordinator/session_request.h"

#include <utility>

#include "common/grammar/constraint_proto.h"

namespace flotilla::coordinator {

SessionRequest SessionRequestOf(const PreparedRequest& prepared, SessionContext context) {
  SessionRequest request;
  request.decoding = prepared.endpoint == Endpoint::kChat ? Decoding::kHarmony : Decoding::kText;
  request.prompts = Prompts(prepared);
  request.n = prepared.n;
  *request.submit.mutable_sampling() = prepared.sampling;
  if (prepared.constraint)
    grammar::ToProto(*prepared.constraint, request.submit.mutable_constraint());
  request.submit.set_return_prompt_logits(prepared.return_prompt_logits);
  request.submit.set_cache_domain(context.cache_domain);
  request.stop = prepared.stop;
  request.echo = prepared.echo;
  request.call_id_seed = std::move(context.call_id_seed);
  request.deadline = context.deadline;
  request.route_key =
      prepared.route_key.empty() ? std::move(context.default_route_key) : prepared.route_key;
  return request;
}

}  // namespace flotilla::coordinator
