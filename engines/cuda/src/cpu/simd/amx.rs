//! Intel's AMX tiles (Sapphire Rapids and later), as the byte kernels use them: eight tile
//! registers of up to 16 rows × 64 bytes, and one instruction (`tdpbsud`) that adds to a
//! 16 × 16 tile of i32 sums the products of 16 rows of signed input bytes with 16 columns of
//! unsigned code bytes, four bytes per lane as VNNI's `vpdpbusd` pairs them: 8192 byte
//! products per instruction where a VNNI instruction does 64.
//!
//! Three things stand between a CPU that lists AMX and one that runs it, and [`granted`]
//! checks all three, once: the CPU's feature bits, the OS enabling the tiles' state (XCR0),
//! and Linux's per-process permission (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), which a virtual
//! machine or a kernel may refuse; without it the first tile instruction faults. The
//! instructions are written as inline assembly (no stable Rust intrinsics cover them); the
//! tile registers are not the compiler's, so nothing else in the process touches them.

/// Whether this process may run AMX's tile and byte instructions (asked of the OS once).
pub(crate) fn granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(probe)
}

#[cfg(target_os = "linux")]
fn probe() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    /// `arch_prctl` asking for an extended state component.
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    /// The tiles' data, state component 18.
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;
    // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8; leaf 1 ECX bit 27 OSXSAVE.
    let leaf7 = __cpuid_count(7, 0);
    let leaf1 = __cpuid_count(1, 0);
    if leaf7.edx & (0b11 << 24) != 0b11 << 24 || leaf1.ecx & (1 << 27) == 0 {
        return false;
    }
    // SAFETY: OSXSAVE is set, so XGETBV runs; XCR0 bits 17 and 18 are the tiles' state.
    let xcr0 = unsafe { _xgetbv(0) };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    // SAFETY: arch_prctl with these two integer arguments reads and writes no memory.
    // A refusal (a VM or kernel that withholds the state) leaves the VNNI kernels in use.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn probe() -> bool {
    false
}

/// The tiles' shapes for groups of `group` bytes (a multiple of 4, at most 64): four sums
/// tiles (0–3) of 16 rows of 16 i32, two input tiles (4, 5) of 16 rows of `group` bytes, two
/// code tiles (6, 7) of `group / 4` rows of 64 bytes (four bytes of each of 16 columns).
/// Four groups' products are in flight at once, since a tile's stored sums reach the
/// vector loads after them late.
#[repr(C, align(64))]
pub(crate) struct Shapes([u8; 64]);

impl Shapes {
    /// Shapes for groups of `group` bytes.
    pub(crate) fn new(group: usize) -> Self {
        debug_assert!(group.is_multiple_of(4) && group <= 64, "group of {group}");
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1
        let mut shape = |tile: usize, rows: usize, width: usize| {
            bytes[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(width as u16).to_le_bytes());
            bytes[48 + tile] = rows as u8;
        };
        for tile in 0..4 {
            shape(tile, 16, 64);
        }
        shape(4, 16, group);
        shape(5, 16, group);
        shape(6, group / 4, 64);
        shape(7, group / 4, 64);
        Self(bytes)
    }
}

/// One group's operands: 16 rows of input bytes (signed; rows `stride` apart, as many as the
/// group) and 16 columns of code bytes (unsigned; `group / 4` rows of 64 bytes, four of each
/// column).
#[derive(Clone, Copy)]
pub(crate) struct Operands {
    /// The first row's first input byte.
    pub inputs: *const i8,
    /// The first code row.
    pub codes: *const u8,
}

impl Operands {
    /// No operands (null pointers), to be replaced before use.
    pub(crate) const EMPTY: Self = Self {
        inputs: std::ptr::null(),
        codes: std::ptr::null(),
    };
}

/// The tile registers configured for one thread's use, released when dropped.
pub(crate) struct Configured(());

impl Configured {
    /// Configures this thread's tiles.
    ///
    /// # Safety
    /// [`granted`] must have returned true.
    pub(crate) unsafe fn new(shapes: &Shapes) -> Self {
        // SAFETY: the caller checked the tiles are granted; `shapes` is a 64-byte palette-1
        // configuration, read and not kept.
        unsafe {
            std::arch::asm!("ldtilecfg [{0}]", in(reg) shapes.0.as_ptr(), options(nostack, readonly))
        };
        Self(())
    }

    /// The sums of four groups' products (`groups[i]` into `out[i]`), inputs `stride` bytes
    /// apart.
    ///
    /// # Safety
    /// Each group's inputs must be readable for 16 rows of `stride` bytes (the last row's
    /// group), and its codes for `group / 4 × 64` bytes (the shapes' group).
    #[inline(always)]
    pub(crate) unsafe fn sums4(
        &self,
        groups: [Operands; 4],
        stride: usize,
        out: &mut [[[i32; 16]; 16]; 4],
    ) {
        let [g0, g1, g2, g3] = groups;
        let c = out.as_mut_ptr();
        // SAFETY: the tiles are configured (self exists); the caller vouches for the reads,
        // and `out` is four tiles of 16 rows of 64 writable bytes.
        unsafe {
            std::arch::asm!(
                "tileloadd tmm4, [{a0} + {stride} * 1]",
                "tileloadd tmm6, [{b0} + {width} * 1]",
                "tilezero tmm0",
                "tdpbsud tmm0, tmm4, tmm6",
                "tileloadd tmm5, [{a1} + {stride} * 1]",
                "tileloadd tmm7, [{b1} + {width} * 1]",
                "tilezero tmm1",
                "tdpbsud tmm1, tmm5, tmm7",
                "tileloadd tmm4, [{a2} + {stride} * 1]",
                "tileloadd tmm6, [{b2} + {width} * 1]",
                "tilezero tmm2",
                "tdpbsud tmm2, tmm4, tmm6",
                "tileloadd tmm5, [{a3} + {stride} * 1]",
                "tileloadd tmm7, [{b3} + {width} * 1]",
                "tilezero tmm3",
                "tdpbsud tmm3, tmm5, tmm7",
                "tilestored [{c} + {width} * 1], tmm0",
                "add {c}, 1024",
                "tilestored [{c} + {width} * 1], tmm1",
                "add {c}, 1024",
                "tilestored [{c} + {width} * 1], tmm2",
                "add {c}, 1024",
                "tilestored [{c} + {width} * 1], tmm3",
                a0 = in(reg) g0.inputs, a1 = in(reg) g1.inputs,
                a2 = in(reg) g2.inputs, a3 = in(reg) g3.inputs,
                b0 = in(reg) g0.codes, b1 = in(reg) g1.codes,
                b2 = in(reg) g2.codes, b3 = in(reg) g3.codes,
                c = inout(reg) c => _, stride = in(reg) stride, width = in(reg) 64usize,
                options(nostack),
            );
        }
    }

    /// One group's sums, into `out`.
    ///
    /// # Safety
    /// As [`Self::sums4`], for the one group.
    #[inline(always)]
    pub(crate) unsafe fn sums1(&self, group: Operands, stride: usize, out: &mut [[i32; 16]; 16]) {
        // SAFETY: as `sums4`.
        unsafe {
            std::arch::asm!(
                "tileloadd tmm4, [{a} + {stride} * 1]",
                "tileloadd tmm6, [{b} + {width} * 1]",
                "tilezero tmm0",
                "tdpbsud tmm0, tmm4, tmm6",
                "tilestored [{c} + {width} * 1], tmm0",
                a = in(reg) group.inputs, b = in(reg) group.codes, c = in(reg) out.as_mut_ptr(),
                stride = in(reg) stride, width = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

impl Drop for Configured {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `new`; releasing them returns their state to
        // the initial one (cheaper to save on a context switch).
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}
