/**
 * @file fiber.cpp
 * @brief The emulator's context switch on x86-64 (System V ABI): the callee-saved registers go on
 *        the old stack, the stack pointer is swapped, and they come back off the new one.
 *        ucontext's swapcontext does the same plus two system calls for the signal mask, which
 *        made the emulated tests ~50× slower. Other processors use ucontext (cuda_runtime.h).
 */
#if defined(__x86_64__) && !defined(MHAR_EMU_UCONTEXT)
// void mhar_emu_switch(void** save_sp /* rdi */, void* load_sp /* rsi */)
asm(R"(
  .pushsection .text
  .globl mhar_emu_switch
  .type mhar_emu_switch, @function
mhar_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mhar_emu_switch, .-mhar_emu_switch
  .popsection
)");
#endif
