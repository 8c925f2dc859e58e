#include "coordinator/chat_prompt.h"

#include "common/harmony/renderer.h"
#include "common/status.h"
#include "coordinator/input_limits.h"
#include "coordinator/structured/chat_constraint.h"

namespace flotilla::coordinator {

absl::Status PrepareChatPrompt(const harmony::ChatConversation& conversation,
                               const harmony::OpenAiRequestOptions& options,
                               const tokenizer::Tokenizer& tok, size_t max_prompt_text_bytes,
                               PreparedRequest& out) {
  FLOTILLA_ASSIGN_OR_RETURN(out.constraint,
                            structured::ChatConstraint(conversation, out.sampling.max_tokens()));
  FLOTILLA_ASSIGN_OR_RETURN(harmony::MappedRequest mapped,
                            harmony::MapChatRequest(conversation, options));
  FLOTILLA_ASSIGN_OR_RETURN(
      harmony::RenderedPrompt prompt,
      harmony::RenderForCompletion(mapped.conversation, harmony::RenderOptions()));
  size_t text_bytes = 0;
  for (const harmony::RenderedPrompt::Segment& s : prompt.segments()) text_bytes += s.text.size();
  FLOTILLA_RETURN_IF_ERROR(
      CheckPromptTextBytes(text_bytes, max_prompt_text_bytes, conversation.messages_field));
  out.prompt = prompt.Tokens(tok);
  return absl::OkStatus();
}

}  // namespace flotilla::coordinator
