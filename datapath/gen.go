package datapath

// The eBPF object is compiled from ../bpf and committed (sockmesh_bpfel.go,
// sockmesh_bpfel.o), so building sockmesh needs no clang. `make generate`
// reproduces it byte for byte; TestGeneratedObjectIsFresh fails when it is
// stale. -I/usr/include/x86_64-linux-gnu finds <asm/types.h> on Debian.
//go:generate go tool bpf2go -cc clang -strip llvm-strip -cflags "-O2 -g -Wall -Werror" -target bpfel -type sm_decision -type sm_family -type sm_service_flags -type sm_answer -type sm_service_key -type sm_service -type sm_pair_key -type sm_pair_counts -type sm_proxy -type sm_orig_dst -type sm_app_sock -type sm_handoff_key -type sm_accel_key -type sm_accel_sock -type sm_accel_counts -type sm_accel_conn -type sm_side -type sm_accel_state -type sm_flow -type sm_decide_args -type sm_answer_args sockmesh ../bpf/sockmesh.c -- -I/usr/include/x86_64-linux-gnu -I../bpf
