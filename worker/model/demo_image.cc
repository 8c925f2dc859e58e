// The demo model's compact checkpoint (tools/demo_model/demo.safetensors),
// built into the object file by the assembler; FLOTILLA_DEMO_IMAGE is its
// path, set by worker/model/CMakeLists.txt, which also rebuilds this file when
// the checkpoint changes.
#include <cstdint>

#include "worker/model/demo_model.h"

#ifndef FLOTILLA_DEMO_IMAGE
#error "FLOTILLA_DEMO_IMAGE must name the demo model's compact checkpoint"
#endif

asm(".pushsection .rodata\n"
    ".balign 64\n"
    ".hidden flotilla_demo_image_begin\n"
    ".globl flotilla_demo_image_begin\n"
    "flotilla_demo_image_begin:\n"
    ".incbin \"" FLOTILLA_DEMO_IMAGE
    "\"\n"
    ".hidden flotilla_demo_image_end\n"
    ".globl flotilla_demo_image_end\n"
    "flotilla_demo_image_end:\n"
    ".popsection\n");

extern "C" const uint8_t flotilla_demo_image_begin[];
extern "C" const uint8_t flotilla_demo_image_end[];

namespace flotilla {

absl::Span<const uint8_t> DemoCompactImage() {
  return {flotilla_demo_image_begin,
          static_cast<size_t>(flotilla_demo_image_end - flotilla_demo_image_begin)};
}

}  // namespace flotilla
